//! `berth`: the portal and control plane in one binary.

mod agent;
mod api;
mod cli;
mod http;
mod metrics;
mod node;
#[cfg(test)]
mod tests;
mod web;

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
