//! Tenancy: tenants (create, suspend, delete, isolation), their members, projects and
//! invitations (`tenants`), and the fabric identifiers hard tenants get (`fabric`).
//!
//! Uses the root, capacity (quota marks) and provisioning (node access plans follow a
//! change of members or isolation); identity calls into it when a sign-in changes a
//! person's tenant or role.

pub mod fabric;
pub mod tenants;
