//! The parts of the `berth` binary, as a library so that benchmarks drive the same router
//! and command line that `berth serve` runs.

pub mod api;
pub mod api_docs;
pub mod assets;
pub mod cli;
pub mod client_address;
pub mod http;
pub mod metrics;
pub mod openapi;
pub mod problem;
pub mod proxy;
pub mod rate_limit;
pub mod served;
pub mod state;
#[cfg(test)]
mod tests;
pub mod web;
