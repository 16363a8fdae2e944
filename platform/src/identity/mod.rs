//! Identity: who someone is and how they prove it. Local accounts and passwords
//! (`accounts`), sign-in throttling (`throttle`), administrators' one-time codes (`totp`),
//! API tokens (`tokens`), OpenID Connect (`oidc`, over `provider_http`, which refuses
//! private addresses) and each tenant's single sign-on (`sso`), and SSH keys (`ssh_keys`).
//!
//! The top wing: it may use every other (a sign-in changes a tenant's members, a new key
//! changes node access plans, suspending a person ends their environment sessions); none
//! uses it. The person every wing reads is at the root (`people`).

pub mod accounts;
pub mod oidc;
pub(crate) mod provider_http;
pub mod ssh_keys;
pub mod sso;
pub(crate) mod throttle;
pub mod tokens;
pub mod totp;
