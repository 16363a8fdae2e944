//! `berth`: the portal and control plane in one binary.

use berth_server::cli;
use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    cli::init_logging(&cli);
    match cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            eprintln!("berth: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}
