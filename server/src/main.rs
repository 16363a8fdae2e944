//! `berth`: the portal and control plane in one binary.

use berth_server::cli;
use clap::Parser;

/// mimalloc rather than glibc's malloc: a page is rendered from thousands of small
/// allocations, made and freed on every worker thread at once, and glibc's arenas spent a
/// fifth of the portal's CPU on them under load, much of it waiting on their locks
/// (BENCHMARKS.md, "Portal under load").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
