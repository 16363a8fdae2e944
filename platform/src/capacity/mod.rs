//! Capacity: what the fleet is, who holds which GPU when, and the rules a booking must
//! pass. The fleet (`fleet`), the in-memory book of every reservation (`book`), the
//! calendar and availability (`booking`), the launch transaction (`environments`: check,
//! place, reserve in one write; `group_commit`: several launches in one writer turn;
//! `idempotency`: a retried launch with the same key gets the first one's booking),
//! quotas and their queue marks (`quotas`), the usage ledger and reports (`metering`), the
//! sums released units are added to (`usage_sums`), monthly budgets (`budgets`), the rate card they charge by (`rates`), monthly statements (`statements`), spot reclaim (`spot`) and maintenance windows (`maintenance`), and
//! volumes with their storage quotas and attachments (`volumes`), and the image catalog
//! with each tenant's rule for custom images (`images`).
//!
//! Uses the root (store, audit, access, people) and `berth_domain`'s placement and booking
//! rules; nothing of provisioning, tenancy or identity. Provisioning reads what it placed.

pub(crate) mod book;
pub mod booking;
pub mod budgets;
pub(crate) mod calendars;
pub mod environments;
pub mod fleet;
pub(crate) mod group_commit;
pub mod idempotency;
pub mod images;
pub mod maintenance;
pub mod metering;
pub mod quotas;
pub mod rates;
pub(crate) mod spot;
pub mod statements;
pub mod usage_sums;
pub mod volumes;
