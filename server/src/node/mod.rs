//! What `berth agent` does to its node besides reporting: run commands through a runner
//! the tests can replace, and keep the node's tenant networks as the portal plans them.

pub mod commands;
pub mod network;
