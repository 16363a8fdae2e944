//! Rate limits on what a script, an agent or a guesser can call in a loop: the JSON API
//! (per bearer token and per source address), the node agents' routes (per node token and
//! per source address), the sign-in paths (password, one-time code, single sign-on find,
//! start and callback; per source address) and an environment origin's `/_berth/auth`
//! (per source address). A request over a limit is answered 429 with `Retry-After` and a
//! problem body, before any handler (or session lookup) runs.
//!
//! Each limit is a GCRA bucket (governor): `N/min` allows a burst of N, refilled evenly
//! over the minute. Buckets live in memory, so a restart refills them. A request whose
//! source address is unknown (only in-process callers, such as the router's tests: `berth
//! serve` always knows the peer) is limited by its token alone. Behind a reverse proxy the
//! source is the proxy's address unless `--trusted-proxies` names it (`client_address.rs`:
//! then the client's, from `X-Forwarded-For`).
//!
//! Tokens are counted under a keyed hash, so the limiter keeps no secret in memory.

use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use http::{HeaderValue, header};

use crate::problem::{Problem, ProblemKind, request_id_of};

/// One limit as configured: `N/s`, `N/min` or `N/h` (a burst of N, refilled evenly over
/// the period), or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit(Option<Quota>);

impl RateLimit {
    pub const OFF: RateLimit = RateLimit(None);

    pub fn parse(text: &str) -> Result<RateLimit, String> {
        let text = text.trim();
        if text == "off" {
            return Ok(RateLimit::OFF);
        }
        let wrong = || format!("\"{text}\" is not a rate like 60/min, 10/s or 1000/h (or off)");
        let (count, period) = text.split_once('/').ok_or_else(wrong)?;
        let count: NonZeroU32 = count.trim().parse().map_err(|_| wrong())?;
        let period = match period.trim() {
            "s" => Duration::from_secs(1),
            "m" | "min" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(wrong()),
        };
        let quota = Quota::with_period(period / count.get()).ok_or_else(wrong)?.allow_burst(count);
        Ok(RateLimit(Some(quota)))
    }
}

/// The limits `berth serve` applies (`--*-rate-limit` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimits {
    /// `/api/v1` per bearer token.
    pub api_per_token: RateLimit,
    /// `/api/v1` per source address, whatever the token.
    pub api_per_address: RateLimit,
    /// `/api/v1/agent/*` per node token.
    pub agent_per_token: RateLimit,
    /// `/api/v1/agent/*` per source address.
    pub agent_per_address: RateLimit,
    /// Password sign-in, the one-time code, and single sign-on's find, start and callback,
    /// per source address.
    pub sign_in_per_address: RateLimit,
    /// An environment origin's `/_berth/auth` (a notebook opened), per source address.
    pub environment_sign_in_per_address: RateLimit,
}

impl RateLimits {
    /// No limits at all.
    pub const OFF: RateLimits = RateLimits {
        api_per_token: RateLimit::OFF,
        api_per_address: RateLimit::OFF,
        agent_per_token: RateLimit::OFF,
        agent_per_address: RateLimit::OFF,
        sign_in_per_address: RateLimit::OFF,
        environment_sign_in_per_address: RateLimit::OFF,
    };
}

/// Which limits a request counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    Api,
    Agent,
    SignIn,
    EnvironmentSignIn,
}

/// The sign-in paths of the portal: the server functions of password sign-in and the
/// one-time code, and single sign-on's routes (`web.rs`).
fn is_sign_in(path: &str) -> bool {
    matches!(path, "/api/sign_in" | "/api/verify_code" | berth_app::SSO_FIND_PATH)
        || path == berth_platform::identity::sso::CALLBACK_PATH
        || (path.starts_with("/auth/oidc/") && path.ends_with("/start"))
}

fn group_of(request: &Request) -> Option<Group> {
    let path = request.uri().path();
    if request.extensions().get::<crate::proxy::EnvironmentHost>().is_some() {
        return (path == crate::proxy::AUTH_PATH).then_some(Group::EnvironmentSignIn);
    }
    if path.starts_with("/api/v1/agent/") {
        Some(Group::Agent)
    } else if path.starts_with("/api/v1/") || path == "/api/v1" {
        Some(Group::Api)
    } else if is_sign_in(path) {
        Some(Group::SignIn)
    } else {
        None
    }
}

type Limiter<K> = Option<DefaultKeyedRateLimiter<K>>;

/// The buckets of every limit, shared by the portal's and the environments' routers.
pub struct Limiters {
    api_per_token: Limiter<u64>,
    api_per_address: Limiter<IpAddr>,
    agent_per_token: Limiter<u64>,
    agent_per_address: Limiter<IpAddr>,
    sign_in_per_address: Limiter<IpAddr>,
    environment_sign_in_per_address: Limiter<IpAddr>,
    /// Hashes tokens with a key of this process's own.
    tokens: RandomState,
    clock: DefaultClock,
    /// Requests counted since the last sweep of idle buckets.
    counted: AtomicU64,
}

/// Idle buckets (full again) are dropped every this many counted requests, so the maps
/// stay as small as the recent callers.
const SWEEP_EVERY: u64 = 4096;

impl Limiters {
    pub fn new(limits: &RateLimits) -> Arc<Limiters> {
        fn keyed<K: std::hash::Hash + Eq + Clone>(limit: RateLimit) -> Limiter<K> {
            limit.0.map(DefaultKeyedRateLimiter::keyed)
        }
        Arc::new(Limiters {
            api_per_token: keyed(limits.api_per_token),
            api_per_address: keyed(limits.api_per_address),
            agent_per_token: keyed(limits.agent_per_token),
            agent_per_address: keyed(limits.agent_per_address),
            sign_in_per_address: keyed(limits.sign_in_per_address),
            environment_sign_in_per_address: keyed(limits.environment_sign_in_per_address),
            tokens: RandomState::new(),
            clock: DefaultClock::default(),
            counted: AtomicU64::new(0),
        })
    }

    /// How long `request` must wait, if it is over a limit; otherwise it is counted.
    fn check(&self, group: Group, request: &Request) -> Result<(), Duration> {
        let address = request.extensions().get::<ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.ip());
        let token = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|token| self.tokens.hash_one(token.trim()));
        let (by_token, by_address) = match group {
            Group::Api => (&self.api_per_token, &self.api_per_address),
            Group::Agent => (&self.agent_per_token, &self.agent_per_address),
            Group::SignIn => (&None, &self.sign_in_per_address),
            Group::EnvironmentSignIn => (&None, &self.environment_sign_in_per_address),
        };
        if self.counted.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            self.sweep();
        }
        // The address first: a flood of made-up tokens from one address is stopped there
        // without filling the token map.
        if let (Some(limiter), Some(address)) = (by_address, address) {
            limiter.check_key(&address).map_err(|until| until.wait_time_from(self.clock.now()))?;
        }
        if let (Some(limiter), Some(token)) = (by_token, token) {
            limiter.check_key(&token).map_err(|until| until.wait_time_from(self.clock.now()))?;
        }
        Ok(())
    }

    fn sweep(&self) {
        for limiter in [&self.api_per_token, &self.agent_per_token].into_iter().flatten() {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        for limiter in [
            &self.api_per_address,
            &self.agent_per_address,
            &self.sign_in_per_address,
            &self.environment_sign_in_per_address,
        ]
        .into_iter()
        .flatten()
        {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }
}

/// The middleware: a request over one of its limits is answered 429 here.
pub async fn limit(State(limiters): State<Arc<Limiters>>, request: Request, next: Next) -> Response {
    let Some(group) = group_of(&request) else {
        return next.run(request).await;
    };
    match limiters.check(group, &request) {
        Ok(()) => next.run(request).await,
        Err(wait) => too_many_requests(wait, request_id_of(request.headers())),
    }
}

/// 429 with `Retry-After` in whole seconds (at least one: a client told 0 would retry at
/// once and be refused again).
fn too_many_requests(wait: Duration, request_id: &str) -> Response {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let seconds = seconds.max(1);
    let detail = format!("too many requests; try again in {seconds} s");
    let mut response = Problem::of(ProblemKind::RateLimited, detail, request_id).into_response();
    if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_a_count_per_period() {
        let per_minute = RateLimit::parse("60/min").expect("valid");
        assert_eq!(per_minute, RateLimit::parse("60/m").expect("valid"));
        let quota = per_minute.0.expect("a limit");
        assert_eq!(quota.burst_size().get(), 60);
        assert_eq!(quota.replenish_interval(), Duration::from_secs(1));
        assert_eq!(RateLimit::parse("off"), Ok(RateLimit::OFF));
        for wrong in ["", "60", "0/s", "-1/s", "10/day", "ten/s", "/s"] {
            assert!(RateLimit::parse(wrong).is_err(), "{wrong}");
        }
    }

    #[test]
    fn paths_fall_in_their_groups() {
        let group = |path: &str| group_of(&Request::get(path).body(axum::body::Body::empty()).expect("request"));
        assert_eq!(group("/api/v1/environments"), Some(Group::Api));
        assert_eq!(group("/api/v1/agent/plan"), Some(Group::Agent));
        assert_eq!(group("/api/sign_in"), Some(Group::SignIn));
        assert_eq!(group("/auth/oidc/acme/start"), Some(Group::SignIn));
        assert_eq!(group("/auth/oidc/callback"), Some(Group::SignIn));
        assert_eq!(group("/api/current_user"), None);
        assert_eq!(group("/environments"), None);
        assert_eq!(group(crate::proxy::AUTH_PATH), None, "on the portal's host, not an environment's");
    }
}
