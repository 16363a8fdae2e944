//! Launching, listing and stopping environments: the user-facing side of the lifecycle.

use std::sync::Arc;

use berth_domain::Refusal;
use berth_domain::booking::{self as rules, Tier, Window, utc_short};
use berth_domain::catalog::{Offering, Size};
use berth_domain::launch::{self, LaunchRequest, LaunchSpec};
use berth_domain::lifecycle::{Desired, EnvState};
use berth_domain::metering::Month;
use berth_domain::mig::{MigProfile, profile_name};
use berth_domain::placement::{Hold, Occupant};
use berth_domain::policy::{Action, Role, Target};
use berth_domain::rates::{RateCard, RateKey};
use berth_domain::serving::Serving;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use sqlx::sqlite::SqliteRow;
use sqlx::{FromRow, Row, SqliteConnection};

use crate::access::Scope;
use crate::audit::{self, Event, Outcome};
use crate::capacity::budgets::BookingCost;
use crate::capacity::idempotency::{self, IdempotencyKey};
use crate::capacity::metering;
use crate::capacity::quotas::{Booker, QuotaAsk};
use crate::capacity::rates::rate_card;
use crate::capacity::volumes;
use crate::metrics::LaunchOutcome;
use crate::store::{Statements, WriteTx};
use crate::{Caller, Error, Platform, now_ms};
use berth_domain::volume::BookingFacts;

/// A launch that passed validation, waiting for its writer turn (`group_commit`).
#[derive(Debug, Clone)]
pub(crate) struct LaunchAsk {
    /// Chosen before the turn, so that a launch asked again after the batch deciding it
    /// was dropped finds out whether that batch committed it.
    pub id: String,
    pub caller: Caller,
    /// The project as the request names it.
    pub project: String,
    pub spec: LaunchSpec,
    pub tier: Tier,
    /// As asked; an "as soon as possible" launch finds its own in the turn.
    pub window: Window,
    pub now: i64,
    /// Asked again after the batch that took it was dropped before answering.
    pub retried: bool,
    /// The API's `Idempotency-Key`, if the request had one.
    pub idempotency: Option<IdempotencyKey>,
    /// The volumes asked for besides the home volume (`LaunchRequest::volumes`).
    pub volumes: Vec<i64>,
}

/// What a launch with an `Idempotency-Key` came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launched {
    pub environment: Environment,
    /// Booked by an earlier request with the same key and request, not by this one.
    pub replayed: bool,
}

/// What a launch decided and wrote inside its batch: what the booking book takes after the
/// COMMIT.
#[derive(Debug)]
pub(crate) struct Decided {
    pub id: String,
    pub booker: Booker,
    pub occupant: Occupant,
    pub assignments: Vec<Hold>,
    pub window: Window,
    pub spot: bool,
    /// Spot bookings it reclaimed, with their new ends.
    pub reclaimed: Vec<(Arc<str>, i64)>,
}

/// What every launch of a batch reads alike, read once for the batch instead of once per
/// launch: each read is a round trip to SQLite's thread (two thread wake-ups, 45 to 60 µs
/// on the contention benchmark's machine), and a dozen of them were about a third of a
/// launch's share of the writer turn. Nothing a launch writes changes these, and the batch
/// holds the writer turn, so nobody else does either.
pub(crate) struct TurnReads {
    /// The rate card, prices and discounts (`rates::rate_card`).
    rates: RateCard,
    /// Whom each active tenant's launches book as; a tenant that may not book is read (and
    /// refused) again each time.
    occupants: FxHashMap<i64, Occupant>,
}

impl TurnReads {
    pub(crate) async fn new(conn: &mut SqliteConnection) -> Result<TurnReads, Error> {
        Ok(TurnReads { rates: rate_card(conn).await?, occupants: FxHashMap::default() })
    }

    /// Who a launch of `tenant_id` (`None`: platform staff) books as, refused unless its
    /// tenant is active.
    async fn occupant(&mut self, conn: &mut SqliteConnection, tenant_id: Option<i64>) -> Result<Occupant, Error> {
        let Some(id) = tenant_id else { return Ok(Occupant::Sharing) };
        if let Some(occupant) = self.occupants.get(&id) {
            return Ok(*occupant);
        }
        let occupant = active_occupant(conn, id).await?;
        self.occupants.insert(id, occupant);
        Ok(occupant)
    }
}

/// One environment as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Environment {
    pub id: String,
    pub owner_id: i64,
    /// `None` for platform staff's own environments.
    pub tenant_id: Option<i64>,
    /// The project whose quota the booking counts against, if any.
    pub project_id: Option<i64>,
    pub name: String,
    pub offering: Offering,
    pub size: &'static Size,
    pub image: Option<String>,
    pub command: Option<String>,
    /// An inference endpoint's model, arguments and variables.
    pub serving: Serving,
    pub cents_per_hour: i64,
    pub state: EnvState,
    pub desired: Desired,
    pub failure_reason: Option<String>,
    pub connection: Option<Connection>,
    pub created_at: i64,
    pub starts_at: i64,
    pub ends_at: i64,
    pub state_changed_at: i64,
    pub ready_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub tier: Tier,
}

/// Which of the environments in reach a listing shows; `None` keeps any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvironmentFilter {
    pub owner_id: Option<i64>,
    pub project_id: Option<i64>,
    pub tenant_id: Option<i64>,
    pub state: StateFilter,
    /// Only those after this one in the listing's order (its `created_at` and id): the
    /// next page.
    pub after: Option<(i64, String)>,
    /// At most this many; `None` for [`LISTING_LIMIT`].
    pub limit: Option<i64>,
}

/// The most environments one listing holds (a page of the environments page, the API's
/// largest page).
pub const LISTING_LIMIT: i64 = 500;

impl EnvironmentFilter {
    /// A filter as a page's query or the API's writes it: ids as numbers, `state` one of
    /// `active`, `finished` or `any`; empty means any.
    pub fn parse(owner: &str, project: &str, tenant: &str, state: &str) -> Result<EnvironmentFilter, Error> {
        let id = |what: &str, text: &str| -> Result<Option<i64>, Error> {
            match text.trim() {
                "" => Ok(None),
                text => text.parse().map(Some).map_err(|_| {
                    Refusal::InvalidListFilter(format!("{what} must be given by its number, not \"{text}\"")).into()
                }),
            }
        };
        let state = match state.trim() {
            "" | "any" => StateFilter::Any,
            "active" => StateFilter::Active,
            "finished" => StateFilter::Finished,
            other => {
                return Err(Refusal::InvalidListFilter(format!(
                    "state \"{other}\" is not one of active, finished or any"
                ))
                .into());
            }
        };
        Ok(EnvironmentFilter {
            owner_id: id("the person", owner)?,
            project_id: id("the project", project)?,
            tenant_id: id("the tenant", tenant)?,
            state,
            after: None,
            limit: None,
        })
    }
}

/// Booked, starting, running or stopping; released or failed; or both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StateFilter {
    #[default]
    Any,
    Active,
    Finished,
}

/// An environment in a listing, with whose it is, by name.
#[derive(Debug, Clone)]
pub struct ListedEnvironment {
    pub environment: Environment,
    pub owner: String,
    pub project: Option<String>,
    /// `None` for platform staff's own environments.
    pub tenant: Option<String>,
}

/// A listing, and what its filter may name: `(id, name)` of the people, projects and
/// tenants the caller's environments in reach belong to.
#[derive(Debug, Clone)]
pub struct EnvironmentListing {
    pub environments: Vec<ListedEnvironment>,
    /// Whether more come after the last one (past the filter's limit).
    pub more: bool,
    pub people: Vec<(i64, String)>,
    pub projects: Vec<(i64, String)>,
    pub tenants: Vec<(i64, String)>,
}

/// How the owner reaches a ready environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    pub url: String,
    /// e.g. "Token" or "API key"; shown with `secret`.
    pub secret_label: Option<String>,
    pub secret: Option<String>,
    /// A command that uses the connection, for copy and paste.
    pub example: String,
}

/// A GPU or MIG slice an environment holds (or held).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldUnit {
    pub site: String,
    pub node: String,
    pub gpu_index: i64,
    pub model: String,
    pub slice_start: i64,
    pub slice_size: i64,
    pub mig_profile: Option<String>,
    pub released_at: Option<i64>,
    /// Which replica of an inference endpoint holds it (0 for everything else).
    pub replica: i64,
}

impl Environment {
    /// Whom the booking counts against.
    pub(crate) fn booker(&self) -> Booker {
        Booker { user_id: self.owner_id, tenant_id: self.tenant_id, project_id: self.project_id }
    }
}

/// A project `p` the caller may book in, given (1) their tenant, (2) whether they are its
/// tenant admin and (3) their user id.
const BOOKABLE_PROJECT: &str = "p.tenant_id = ?1
    AND (?2 OR EXISTS (SELECT 1 FROM project_members m WHERE m.project_id = p.id AND m.user_id = ?3))";

pub(crate) const ENVIRONMENT_COLUMNS: &str =
    "id, owner_id, tenant_id, project_id, name, offering, size_id, image, command, serving, cents_per_hour, state,
     desired, failure_reason, connection, created_at, starts_at, ends_at, state_changed_at, ready_at, finished_at, tier";

pub(crate) fn environment_from_row(row: &SqliteRow) -> Result<Environment, Error> {
    EnvironmentRow::from_row(row)?.try_into()
}

/// An `environments` row as stored ([`ENVIRONMENT_COLUMNS`]); [`Environment`] is it read.
#[derive(sqlx::FromRow)]
struct EnvironmentRow {
    id: String,
    owner_id: i64,
    tenant_id: Option<i64>,
    project_id: Option<i64>,
    name: String,
    offering: String,
    size_id: String,
    image: Option<String>,
    command: Option<String>,
    serving: Option<String>,
    cents_per_hour: i64,
    state: String,
    desired: String,
    failure_reason: Option<String>,
    connection: Option<String>,
    created_at: i64,
    starts_at: i64,
    ends_at: i64,
    state_changed_at: i64,
    ready_at: Option<i64>,
    finished_at: Option<i64>,
    tier: String,
}

impl TryFrom<EnvironmentRow> for Environment {
    type Error = Error;

    fn try_from(row: EnvironmentRow) -> Result<Environment, Error> {
        let corrupt = |what: &str| Error::internal(format!("environment row has an unknown {what}"));
        let offering = Offering::parse(&row.offering).ok_or_else(|| corrupt("offering"))?;
        Ok(Environment {
            id: row.id,
            owner_id: row.owner_id,
            tenant_id: row.tenant_id,
            project_id: row.project_id,
            name: row.name,
            offering,
            size: offering.size(&row.size_id).ok_or_else(|| corrupt("size"))?,
            image: row.image,
            command: row.command,
            serving: row
                .serving
                .map(|s| serde_json::from_str(&s))
                .transpose()
                .map_err(Error::internal)?
                .unwrap_or_default(),
            cents_per_hour: row.cents_per_hour,
            state: EnvState::parse(&row.state).ok_or_else(|| corrupt("state"))?,
            desired: Desired::parse(&row.desired).ok_or_else(|| corrupt("desired state"))?,
            failure_reason: row.failure_reason,
            connection: row.connection.map(|c| serde_json::from_str(&c)).transpose().map_err(Error::internal)?,
            created_at: row.created_at,
            starts_at: row.starts_at,
            ends_at: row.ends_at,
            state_changed_at: row.state_changed_at,
            ready_at: row.ready_at,
            finished_at: row.finished_at,
            tier: Tier::parse(&row.tier).map_err(|_| corrupt("tier"))?,
        })
    }
}

impl Platform {
    /// Validates the request, places it on capacity free for its window (now or later)
    /// and records the environment and its reservations in a `BEGIN IMMEDIATE`
    /// transaction together with the quota check: either all of it is written or none,
    /// and two bookings can never be given the same GPU or slice at the same time.
    ///
    /// Launches that wait for the writer turn together are decided in one transaction,
    /// each in its own savepoint, in the order they asked (`group_commit`); each is still
    /// all or nothing, and its answer comes only after the COMMIT.
    pub async fn launch(&self, caller: &Caller, request: &LaunchRequest) -> Result<Environment, Error> {
        Ok(self.launch_keyed(caller, request, None).await?.environment)
    }

    /// [`Platform::launch`] with the API's `Idempotency-Key`: the same person sending the
    /// same request with the same key again (within `idempotency::KEY_HOURS`) gets the
    /// environment the first one booked, and nothing more is booked; the same key with
    /// another request is refused. A refused launch keeps no key.
    pub async fn launch_once(&self, caller: &Caller, request: &LaunchRequest, key: &str) -> Result<Launched, Error> {
        launch::check_idempotency_key(key)?;
        let request_sha256 = crate::sha256_hex(&serde_json::to_string(request).map_err(Error::internal)?);
        self.launch_keyed(caller, request, Some(IdempotencyKey { key: key.to_owned(), request_sha256 })).await
    }

    /// [`Platform::decide_keyed`], timed and counted for `/metrics`: booked or refused per
    /// offering. A replay under an idempotency key booked nothing and an internal error
    /// decided nothing, so neither counts.
    async fn launch_keyed(
        &self,
        caller: &Caller,
        request: &LaunchRequest,
        idempotency: Option<IdempotencyKey>,
    ) -> Result<Launched, Error> {
        let started = std::time::Instant::now();
        let result = self.decide_keyed(caller, request, idempotency).await;
        let outcome = match &result {
            Ok(launched) if !launched.replayed => Some(LaunchOutcome::Booked),
            Ok(_) | Err(Error::Internal(_)) => None,
            Err(_) => Some(LaunchOutcome::Refused),
        };
        if let Some(outcome) = outcome {
            self.metrics().launch_ended(Offering::parse(&request.offering), outcome, started.elapsed());
        }
        result
    }

    async fn decide_keyed(
        &self,
        caller: &Caller,
        request: &LaunchRequest,
        idempotency: Option<IdempotencyKey>,
    ) -> Result<Launched, Error> {
        self.authorize_in_tenant(caller, Action::EnvironmentLaunch).await?;
        let spec = launch::validate(request, &self.image_choice(caller).await?)?;
        let now = now_ms();
        let start = rules::parse_start(&request.start)?;
        let tier = Tier::parse(&request.tier)?;
        if tier == Tier::Spot && start.is_some_and(|s| s > now + self.policy.start_grace_ms) {
            return Err(Refusal::SpotStartsNow.into());
        }
        // "As soon as possible" finds its start under the writer turn (`decide_launch`).
        let asked_window = rules::new_window(start, spec.hours, now, &self.policy)?;
        let ask = LaunchAsk {
            id: uuid::Uuid::new_v4().to_string(),
            caller: caller.clone(),
            project: request.project.clone(),
            spec,
            tier,
            window: asked_window,
            now,
            retried: false,
            idempotency,
            volumes: berth_domain::volume::parse_volume_ids(&request.volumes)?,
        };
        let asked_id = ask.id.clone();
        let id = self.launch_in_turn(ask).await?;
        // Another id than the one chosen for this launch: an earlier one's, under the key.
        let replayed = id != asked_id;
        if !replayed {
            self.wake_reconciler();
        }
        Ok(Launched { environment: self.environment_of(caller, &id).await?, replayed })
    }

    /// One launch's share of a writer turn, inside the group commit's transaction and its
    /// own savepoint: checks, placement among what is booked and what the launches before
    /// it in the batch decided, quota, and its rows. The booking book follows after the
    /// COMMIT, from what this returns.
    pub(crate) async fn decide_launch(
        &self,
        tx: &mut WriteTx,
        reads: &mut TurnReads,
        ask: &LaunchAsk,
    ) -> Result<Decided, Error> {
        let LaunchAsk {
            id,
            caller,
            spec,
            tier,
            window: asked_window,
            now,
            idempotency: key,
            volumes: asked_volumes,
            ..
        } = ask;
        let (tier, asked_window, now) = (*tier, *asked_window, *now);
        // A hard or hybrid tenant's nodes are its own, so who books matters to placement.
        let occupant = reads.occupant(tx, caller.tenant_id()).await?;
        let booker = Booker {
            user_id: caller.user_id(),
            tenant_id: caller.tenant_id(),
            project_id: self.project_to_book_in(tx, caller, &ask.project).await?,
        };
        let in_use: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM environments WHERE owner_id = ? AND name = ? AND state NOT IN ('released', 'failed')",
        )
        .bind(caller.user_id())
        .bind(&spec.name)
        .fetch_one(&mut **tx)
        .await?;
        if in_use > 0 {
            return Err(Refusal::NameInUse(spec.name.clone()).into());
        }
        // "As soon as possible" looks past a month whose budget the booking would exceed:
        // the earliest start from the next month on, until the search's days run out.
        let mut not_before = now;
        let (window, size, assignments, reclaim, cents_per_hour) = loop {
            let window = match spec.earliest_within_days {
                None => asked_window,
                Some(days) => self.earliest_window(tx, spec, days, not_before, now, tier, occupant).await?,
            };
            let (size, assignments, reclaim) = self.place_any(tx, spec, window, now, tier, occupant).await?;
            // Quotas count the model actually placed.
            let ask = QuotaAsk { model: size.gpu_model(), window, gpus: rules::gpu_equivalents(&assignments), tier };
            self.check_quota(tx, booker, ask, None).await?;
            // The price in force now (a booking needs one); the budget counts the rates over
            // its window, changes to come included.
            let (rate_key, _) = RateKey::of_shape(size.shape);
            let cents_per_hour = reads
                .rates
                .size_price_at(size.shape, now)
                .ok_or_else(|| Refusal::Unpriced(format!("{} ({})", size.label, rate_key.label())))?;
            let units = i64::try_from(assignments.len()).unwrap_or(i64::MAX);
            let cost = BookingCost { what: "booking", key: rate_key, units, tier, window, hours: spec.hours };
            match self.check_budgets(tx, caller, booker, cost, &reads.rates).await {
                Err(Error::Refused(Refusal::OverBudget(why))) => {
                    let next_month = Month::of(window.starts_at).next().starts_at();
                    let search_ends = spec.earliest_within_days.map_or(0, |days| now + i64::from(days) * rules::DAY_MS);
                    if next_month > search_ends {
                        return Err(Refusal::OverBudget(why).into());
                    }
                    not_before = next_month;
                }
                Err(e) => return Err(e),
                Ok(()) => break (window, size, assignments, reclaim, cents_per_hour),
            }
        };
        let reclaimed = self.reclaim(tx, &reclaim, window, now).await?;

        // The environment, its units with their ledger rows, and its audit row: one round
        // trip. The volumes attach after it (they read the environment's row).
        let serving = (spec.serving != Serving::default())
            .then(|| serde_json::to_string(&spec.serving))
            .transpose()
            .map_err(Error::internal)?;
        let detail =
            format!("{} {} for {} h from {}", spec.offering.id(), size.id, spec.hours, utc_short(window.starts_at));
        let actor = caller.actor();
        let mut writes = Statements::new();
        writes
            .push(
                "INSERT INTO environments (id, owner_id, tenant_id, project_id, name, offering, size_id, image, command,
                     serving, cents_per_hour, state, desired, created_at, starts_at, ends_at, state_changed_at, tier)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'requested', 'running', ?, ?, ?, ?, ?);",
            )
            .bind(id.as_str())
            .bind(booker.user_id)
            .bind(booker.tenant_id)
            .bind(booker.project_id)
            .bind(spec.name.as_str())
            .bind(spec.offering.id())
            .bind(size.id)
            .bind(spec.image.as_deref())
            .bind(spec.command.as_deref())
            .bind(serving)
            .bind(cents_per_hour)
            .bind(now)
            .bind(window.starts_at)
            .bind(window.ends_at)
            .bind(now)
            .bind(tier.as_str());
        push_reservations(&mut writes, id, &assignments, window, 0, now);
        let event = Event {
            action: "environment.launch",
            target: Some(id.as_str()),
            outcome: Outcome::Success,
            detail: Some(&detail),
        };
        audit::push(&mut writes, &actor, event);
        writes.execute(tx).await?;
        let facts =
            BookingFacts { tenant_id: booker.tenant_id, owner_id: booker.user_id, project_id: booker.project_id };
        volumes::attach_for_launch(tx, id, spec.offering, facts, occupant, asked_volumes, now, &actor).await?;
        if let Some(key) = key {
            idempotency::remember(tx, booker.user_id, key, id, now).await?;
        }
        Ok(Decided { id: id.clone(), booker, occupant, assignments, window, spot: tier == Tier::Spot, reclaimed })
    }

    /// The sizes a launch may take, in order: the one asked for, then the same size on the
    /// other GPU models the request allows.
    fn sizes_of(spec: &LaunchSpec) -> impl Iterator<Item = &'static Size> + '_ {
        std::iter::once(spec.size).chain(spec.alternatives.iter().copied())
    }

    /// Places the first of the launch's sizes that is free for `window`; failing that, for a
    /// guaranteed booking, the first that spot bookings hold (free capacity on another model
    /// goes before taking anyone's). If none fits, the refusal explains the size asked for
    /// and names the others.
    async fn place_any(
        &self,
        tx: &mut WriteTx,
        spec: &LaunchSpec,
        window: Window,
        now: i64,
        tier: Tier,
        occupant: Occupant,
    ) -> Result<(&'static Size, Vec<Hold>, Vec<std::sync::Arc<str>>), Error> {
        let mut tried = Vec::new();
        for size in Self::sizes_of(spec) {
            if let Some(assignments) = self.place_from_book(tx, size.shape, window, now, occupant).await? {
                return Ok((size, assignments, Vec::new()));
            }
            let nearby = self.timeline_in(tx, size.gpu_model(), now, Some(window)).await?;
            match nearby.place(size.shape, window, occupant) {
                Ok(assignments) => return Ok((size, assignments, Vec::new())),
                Err(refusal) => tried.push((size, nearby, refusal)),
            }
        }
        for (size, nearby, _) in &tried {
            if let Some((assignments, reclaim)) =
                self.place_reclaiming_spot(nearby, size.shape, window, now, tier, occupant)
            {
                return Ok((size, assignments, reclaim));
            }
        }
        let (size, nearby, refusal) = tried.swap_remove(0);
        let asked =
            crate::capacity::booking::Asked { offering: spec.offering, size, hours: spec.hours, window, occupant };
        let mut explained = self.explain_no_capacity(tx, refusal, &nearby, asked, now).await?;
        if let Error::Refused(Refusal::NoCapacity { size: what, .. }) = &mut explained
            && !spec.alternatives.is_empty()
        {
            *what = Self::sizes_of(spec).map(|s| s.shape.describe()).collect::<Vec<_>>().join(" or ");
        }
        Err(explained)
    }

    /// The window of an "as soon as possible" booking: the earliest start within `days` at
    /// which one of its sizes is free for the whole duration. Found under the writer turn
    /// that then books it, so nobody can take it in between.
    #[allow(clippy::too_many_arguments)] // the launch's own facts, passed on as they are
    async fn earliest_window(
        &self,
        tx: &mut WriteTx,
        spec: &LaunchSpec,
        days: u32,
        not_before: i64,
        now: i64,
        tier: Tier,
        occupant: Occupant,
    ) -> Result<Window, Error> {
        let search_days = i64::from(days).min(self.policy.horizon_ms / rules::DAY_MS);
        let latest_start = now + search_days * rules::DAY_MS;
        self.load_book(tx).await?;
        let mut earliest: Option<i64> = None;
        for size in Self::sizes_of(spec) {
            let gpus = self.gpus_of_model(tx, size.gpu_model()).await?;
            let start = self.earliest_start_on(&gpus, size.shape, spec.hours, not_before, now, occupant);
            earliest = earliest.into_iter().chain(start).min();
        }
        let start = earliest.filter(|&t| t <= latest_start).ok_or_else(|| Refusal::NoCapacity {
            size: Self::sizes_of(spec).map(|s| s.shape.describe()).collect::<Vec<_>>().join(" or "),
            when: format!("within the next {search_days} days"),
            detail: format!("no start in that time leaves it free for all of {} h", spec.hours),
            hint: ". Instead: a longer search, a shorter duration or another size".into(),
        })?;
        if tier == Tier::Spot && start > now + self.policy.start_grace_ms {
            return Err(Refusal::SpotStartsNow.into());
        }
        Ok(rules::new_window((start > now).then_some(start), spec.hours, now, &self.policy)?)
    }

    /// The projects the caller may book in, as `(id, name)` by name: those of their tenant
    /// they are a member of, or all of their tenant's for its tenant admins.
    pub async fn projects_to_book_in(&self, caller: &Caller) -> Result<Vec<(i64, String)>, Error> {
        // Asking where one may book is no attempt to book: a role that may not launch gets
        // no projects, and no denial in the audit log (the launch form asks on every visit).
        if !crate::access::may_in_tenant(caller, Action::EnvironmentLaunch) {
            return Ok(Vec::new());
        }
        let mut conn = self.db.acquire().await?;
        Ok(sqlx::query_as(&format!("SELECT p.id, p.name FROM projects p WHERE {BOOKABLE_PROJECT} ORDER BY p.name"))
            .bind(caller.tenant_id())
            .bind(caller.principal.role == Role::TenantAdmin)
            .bind(caller.user_id())
            .fetch_all(&mut *conn)
            .await?)
    }

    /// The project a launch names (by id, as the form sends it), if the caller may book in
    /// it; anything else is answered like a missing project.
    pub(crate) async fn project_to_book_in(
        &self,
        conn: &mut SqliteConnection,
        caller: &Caller,
        project: &str,
    ) -> Result<Option<i64>, Error> {
        let project = project.trim();
        if project.is_empty() {
            return Ok(None);
        }
        let unknown = || Error::Refused(Refusal::UnknownProject(project.to_owned()));
        let id: i64 = project.parse().map_err(|_| unknown())?;
        let allowed: Option<i64> =
            sqlx::query_scalar(&format!("SELECT p.id FROM projects p WHERE {BOOKABLE_PROJECT} AND p.id = ?4"))
                .bind(caller.tenant_id())
                .bind(caller.principal.role == Role::TenantAdmin)
                .bind(caller.user_id())
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?;
        allowed.map(Some).ok_or_else(unknown)
    }

    /// Asks for the environment to be torn down; the reconciler does the rest.
    pub async fn stop(&self, caller: &Caller, id: &str) -> Result<Environment, Error> {
        self.environment_for(caller, id, Action::EnvironmentChange).await?;
        let mut tx = self.begin_write().await?;
        let env = environment_in(&mut tx, id).await?;
        if !env.state.is_stoppable() || env.desired == Desired::Released {
            let what = if env.state.is_stoppable() || env.state == EnvState::TearingDown {
                "stopping"
            } else {
                env.state.as_str()
            };
            return Err(Refusal::NotStoppable(what).into());
        }
        sqlx::query("UPDATE environments SET desired = 'released' WHERE id = ?").bind(id).execute(&mut *tx).await?;
        let event = Event { action: "environment.stop", target: Some(id), outcome: Outcome::Success, detail: None };
        audit::record(&mut tx, &caller.actor(), event).await?;
        tx.commit().await?;
        self.wake_reconciler();
        self.environment_of(caller, id).await
    }

    /// The caller's own environments not over (released or failed) whose window meets
    /// `from..to`, by start: what the calendar draws beside free capacity. Only those, not
    /// the caller's latest, so a long history costs the calendar nothing and hides nothing.
    pub async fn environments_of_owner_between(
        &self,
        caller: &Caller,
        from: i64,
        to: i64,
    ) -> Result<Vec<Environment>, Error> {
        self.authorize_in_tenant(caller, Action::EnvironmentRead).await?;
        let rows = sqlx::query(&format!(
            "SELECT {ENVIRONMENT_COLUMNS} FROM environments
             WHERE owner_id = ? AND state NOT IN ('released', 'failed') AND starts_at < ? AND ends_at > ?
             ORDER BY starts_at, id"
        ))
        .bind(caller.user_id())
        .bind(to)
        .bind(from)
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(environment_from_row).collect()
    }

    /// The environments the caller may see (their tenant's for tenant admins and viewers,
    /// all for platform staff, their own for members) that `filter` keeps, newest first,
    /// with whose, which project's and which tenant's each is, and whom and which projects
    /// the filter could name.
    pub async fn environments_in_reach(
        &self,
        caller: &Caller,
        filter: &EnvironmentFilter,
    ) -> Result<EnvironmentListing, Error> {
        self.authorize_in_tenant(caller, Action::EnvironmentRead).await?;
        let scope = Scope::of(caller, Action::EnvironmentRead).ok_or(Error::Forbidden)?;
        let limit = filter.limit.unwrap_or(LISTING_LIMIT).clamp(1, LISTING_LIMIT);
        // The filter inside the scope's subquery, the names joined outside it (the
        // environment's columns keep their names).
        let sql = format!(
            "SELECT e.*, coalesce(nullif(u.display_name, ''), u.email) AS owner_name, p.name AS project_name,
                    t.name AS tenant_name
             FROM (SELECT {ENVIRONMENT_COLUMNS} FROM environments
                   WHERE {} AND (?4 IS NULL OR owner_id = ?4) AND (?5 IS NULL OR project_id = ?5)
                     AND (?6 IS NULL OR tenant_id = ?6)
                     AND (?7 IS NULL OR (state IN ('released', 'failed')) = ?7)
                     AND (?8 IS NULL OR created_at < ?8 OR (created_at = ?8 AND id > ?9))
                   ORDER BY created_at DESC, id LIMIT ?10) e
             JOIN users u ON u.id = e.owner_id
             LEFT JOIN projects p ON p.id = e.project_id
             LEFT JOIN tenants t ON t.id = e.tenant_id
             ORDER BY e.created_at DESC, e.id",
            Scope::condition("owner_id")
        );
        let finished = match filter.state {
            StateFilter::Any => None,
            StateFilter::Active => Some(false),
            StateFilter::Finished => Some(true),
        };
        let rows = scope
            .bind(sqlx::query(&sql))
            .bind(filter.owner_id)
            .bind(filter.project_id)
            .bind(filter.tenant_id)
            .bind(finished)
            .bind(filter.after.as_ref().map(|(created_at, _)| *created_at))
            .bind(filter.after.as_ref().map(|(_, id)| id.as_str()))
            // One more than asked says whether there are more.
            .bind(limit + 1)
            .fetch_all(&self.db)
            .await?;
        let more = i64::try_from(rows.len()).is_ok_and(|n| n > limit);
        let environments = rows
            .iter()
            .map(|row| {
                Ok(ListedEnvironment {
                    environment: environment_from_row(row)?,
                    owner: row.try_get("owner_name")?,
                    project: row.try_get("project_name")?,
                    tenant: row.try_get("tenant_name")?,
                })
            })
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .collect::<Result<Vec<_>, Error>>()?;
        // What the filter may name: the owners, projects and tenants of environments in reach.
        let choices = async |column: &str, name: &str, table: &str| -> Result<Vec<(i64, String)>, Error> {
            let sql = format!(
                "SELECT DISTINCT x.id, {name}
                 FROM (SELECT {column} FROM environments WHERE {}) e JOIN {table} x ON x.id = e.{column} ORDER BY 2",
                Scope::condition("owner_id")
            );
            let rows = scope.bind(sqlx::query(&sql)).fetch_all(&self.db).await?;
            rows.iter().map(|row| Ok((row.try_get(0)?, row.try_get(1)?))).collect()
        };
        let people = choices("owner_id", "coalesce(nullif(x.display_name, ''), x.email)", "users").await?;
        let projects = choices("project_id", "x.name", "projects").await?;
        let tenants = choices("tenant_id", "x.name", "tenants").await?;
        Ok(EnvironmentListing { environments, more, people, projects, tenants })
    }

    /// The environment `id` if the caller may see it.
    pub async fn environment_of(&self, caller: &Caller, id: &str) -> Result<Environment, Error> {
        self.environment_for(caller, id, Action::EnvironmentRead).await
    }

    /// The environment `id` if the caller may take `action` on it. Otherwise `NotFound`
    /// (or `Forbidden` when they may see it but not do this), and the denial is audited.
    pub(crate) async fn environment_for(
        &self,
        caller: &Caller,
        id: &str,
        action: Action,
    ) -> Result<Environment, Error> {
        let mut conn = self.db.acquire().await?;
        let env = environment_in(&mut conn, id).await?;
        drop(conn);
        self.authorize(caller, action, Target::Owned { tenant_id: env.tenant_id, owner_id: env.owner_id }).await?;
        Ok(env)
    }

    /// Environments per state, for `/metrics`.
    pub async fn environments_by_state(&self) -> Result<Vec<(EnvState, i64)>, Error> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT state, count(*) FROM environments GROUP BY state").fetch_all(&self.db).await?;
        Ok(EnvState::ALL
            .into_iter()
            .map(|s| (s, rows.iter().find(|(name, _)| name == s.as_str()).map_or(0, |(_, n)| *n)))
            .collect())
    }
}

/// One environment, read inside the caller's transaction (after `environment_for` has
/// checked who may act on it: an environment's owner and tenant never change).
pub(crate) async fn environment_in(conn: &mut SqliteConnection, id: &str) -> Result<Environment, Error> {
    let row = sqlx::query(&format!("SELECT {ENVIRONMENT_COLUMNS} FROM environments WHERE id = ?"))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or(Error::NotFound)?;
    environment_from_row(&row)
}

pub(crate) async fn held_units(conn: &mut SqliteConnection, environment_id: &str) -> Result<Vec<HeldUnit>, Error> {
    let rows: Vec<UnitRow> = sqlx::query_as(&format!(
        "SELECT {UNIT_COLUMNS}, r.released_at, r.replica FROM {UNIT_TABLES}
         WHERE r.environment_id = ? ORDER BY n.name, g.idx, r.slice_start"
    ))
    .bind(environment_id)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| HeldUnit {
            mig_profile: row.mig_profile_name(),
            site: row.site,
            node: row.node,
            gpu_index: row.idx,
            model: row.model,
            slice_start: row.slice_start,
            slice_size: row.slice_size,
            released_at: row.released_at,
            replica: row.replica,
        })
        .collect())
}

/// The columns [`UnitRow`] reads, from [`UNIT_TABLES`].
pub(crate) const UNIT_COLUMNS: &str =
    "r.environment_id, s.name AS site, n.name AS node, g.idx, g.model, r.slice_start, r.slice_size, r.mig_profile";
/// A reservation with the GPU, node and site it is on (`r`, `g`, `n`, `s`).
pub(crate) const UNIT_TABLES: &str = "reservations r JOIN gpus g ON g.id = r.gpu_id JOIN nodes n ON n.id = g.node_id
     JOIN sites s ON s.id = n.site_id";

/// A reserved GPU or slice where it is: the part of a reservation that an environment's
/// page and a backend both read.
#[derive(sqlx::FromRow)]
pub(crate) struct UnitRow {
    pub environment_id: String,
    pub site: String,
    pub node: String,
    pub idx: i64,
    pub model: String,
    pub slice_start: i64,
    pub slice_size: i64,
    /// Stored model-independent (`3g`).
    pub mig_profile: Option<String>,
    #[sqlx(default)]
    pub released_at: Option<i64>,
    #[sqlx(default)]
    pub replica: i64,
}

impl UnitRow {
    /// The slice's MIG profile as the model names it (`3g.40gb`), for pages and backends.
    pub(crate) fn mig_profile_name(&self) -> Option<String> {
        self.mig_profile.as_deref().map(|key| profile_name(&self.model, key))
    }
}

/// Reserves `holds` (up to a node's GPUs) of an environment's `replica` (0 for all but an
/// endpoint's extra replicas) for `window`, with their ledger rows booked at `now`: one
/// round trip to the database inside the writer turn ([`push_reservations`]). The
/// database's triggers check every row for overlaps.
pub(crate) async fn insert_reservations(
    conn: &mut SqliteConnection,
    environment_id: &str,
    holds: &[Hold],
    window: Window,
    replica: i64,
    now: i64,
) -> Result<(), Error> {
    let mut insert = Statements::new();
    push_reservations(&mut insert, environment_id, holds, window, replica, now);
    insert.execute(conn).await
}

/// [`insert_reservations`]' statements added to `statements`: the reservations in one
/// INSERT, then their ledger rows ([`metering::RECORD_UNITS`]).
fn push_reservations<'q>(
    statements: &mut Statements<'q>,
    environment_id: &'q str,
    holds: &[Hold],
    window: Window,
    replica: i64,
    now: i64,
) {
    if holds.is_empty() {
        return;
    }
    statements.push(
        "INSERT INTO reservations (environment_id, gpu_id, slice_start, slice_size, mig_profile, starts_at, ends_at,
             replica) VALUES ",
    );
    for (i, hold) in holds.iter().enumerate() {
        statements
            .push(if i == 0 { "(?, ?, ?, ?, ?, ?, ?, ?)" } else { ", (?, ?, ?, ?, ?, ?, ?, ?)" })
            .bind(environment_id)
            .bind(hold.gpu_id)
            .bind(i64::from(hold.slices.start))
            .bind(i64::from(hold.slices.size))
            .bind(hold.profile.map(MigProfile::key))
            .bind(window.starts_at)
            .bind(window.ends_at)
            .bind(replica);
    }
    statements.push(";").push(metering::RECORD_UNITS).push(";").bind(now).bind(environment_id).bind(replica);
}

/// Refuses when the tenant is suspended or deleted. Inside a write transaction this holds
/// against a tenant change committed a moment before, which the caller's session did not
/// see yet: nothing is launched into a deleted tenant.
pub(crate) async fn ensure_tenant_active(conn: &mut SqliteConnection, tenant_id: i64) -> Result<(), Error> {
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM tenants WHERE id = ?").bind(tenant_id).fetch_optional(conn).await?;
    active(status.as_deref())
}

/// A tenant of `status` (`None`: no such tenant) may book.
fn active(status: Option<&str>) -> Result<(), Error> {
    match status {
        Some("active") => Ok(()),
        Some("suspended") => Err(Refusal::TenantNotActive("suspended").into()),
        _ => Err(Refusal::TenantNotActive("deleted").into()),
    }
}

/// Who a launch of the tenant books as, refused unless the tenant is active:
/// `ensure_tenant_active` and `book::occupant_of` in one read of the tenant's row.
async fn active_occupant(conn: &mut SqliteConnection, tenant_id: i64) -> Result<Occupant, Error> {
    let row: Option<(String, String)> = sqlx::query_as("SELECT status, isolation FROM tenants WHERE id = ?")
        .bind(tenant_id)
        .fetch_optional(conn)
        .await?;
    active(row.as_ref().map(|(status, _)| status.as_str()))?;
    let isolation = crate::capacity::book::parse_isolation(row.as_ref().map(|(_, isolation)| isolation.as_str()))?;
    Ok(Occupant::of(Some(tenant_id), isolation))
}
