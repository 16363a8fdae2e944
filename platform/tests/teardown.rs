//! Teardown you can trust, on the simulated backend and on Kubernetes (a stateful fake API
//! server): the orphan sweep, a deleted tenant leaving nothing behind (its Kueue queue
//! included), a tenant's queue following its quota, and 1,000 random create/stop cycles
//! with injected faults and reconciler crashes, checked afterwards with SQL written
//! independently of the booking code.
#![allow(clippy::expect_used, clippy::unwrap_used)] // helpers of tests stop the test with their message

mod common;
mod kubernetes_api;

#[path = "teardown/kueue.rs"]
mod kueue;
#[path = "teardown/orphan_sweep.rs"]
mod orphan_sweep;
#[path = "teardown/random_cycles.rs"]
mod random_cycles;
#[path = "teardown/support.rs"]
mod support;
#[path = "teardown/tenant_deletion.rs"]
mod tenant_deletion;
