//! `sqlx::migrate!` reads `migrations/` when this crate compiles, but on stable Rust it
//! cannot tell cargo so: without this, a new migration is missed by every build that finds
//! the crate up to date, and the binary runs the schema of its last build.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
