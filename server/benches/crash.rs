//! Crash under load (BENCHMARKS.md): clients book through the JSON API of a real `berth
//! serve` while it is killed with SIGKILL again and again, and restarted each time on the
//! same SQLite file. Afterwards every booking a client was told is confirmed (201 with its
//! id) must be in the database with all its reservations, no two reservations may overlap
//! (the tests' independent checker, shared rather than copied) and `PRAGMA
//! integrity_check` must answer `ok`.
//!
//! `cargo bench -p berth-server --bench crash` (a release `berth`)
//! `CRASH_KILLS=20` `CRASH_CLIENTS=32` `BERTH_BIN=<another berth binary>`
//! `BENCH_SMOKE=1`: 3 kills, 4 clients, a few seconds (what `make bench-smoke` runs).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::print_stdout)] // a benchmark's output is its point

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use berth_domain::policy::{Principal, Role};
use berth_domain::tenancy::Isolation;
use berth_platform::{Caller, Platform, RequestMeta, store};
use rand::{Rng, SeedableRng};
use tokio::sync::Mutex;

// The tests' independent checker, shared rather than written again.
#[allow(dead_code)]
#[path = "../../platform/tests/common/overlaps.rs"]
mod overlaps;

/// The sizes clients book, with how many reservations each holds.
const SIZES: [(&str, &str, i64); 5] = [
    ("training", "h100-1", 1),
    ("training", "h100-4", 4),
    ("training", "h100-8", 8),
    ("notebook", "h100-1g.10gb", 1),
    ("notebook", "h100-3g.40gb", 1),
];

struct Settings {
    kills: usize,
    clients: usize,
    nodes: usize,
    /// How long the server runs between a restart and the next kill, at random.
    uptime: std::ops::Range<f64>,
    smoke: bool,
}

impl Settings {
    fn from_env() -> Settings {
        let smoke = std::env::var("BENCH_SMOKE").is_ok_and(|v| v == "1");
        let number =
            |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
        if smoke {
            Settings {
                kills: number("CRASH_KILLS", 3),
                clients: number("CRASH_CLIENTS", 4),
                nodes: 8,
                uptime: 0.3..0.8,
                smoke,
            }
        } else {
            Settings {
                kills: number("CRASH_KILLS", 20),
                clients: number("CRASH_CLIENTS", 32),
                nodes: 64,
                uptime: 0.5..2.5,
                smoke,
            }
        }
    }
}

/// A booking a client was told is confirmed.
struct Confirmed {
    id: String,
    reservations: i64,
}

#[derive(Default)]
struct Tally {
    confirmed: Vec<Confirmed>,
    /// Answered 4xx (no capacity, say), by status and message.
    refused: std::collections::BTreeMap<String, u64>,
    /// No answer (the server was killed mid-request, or was down) or a 5xx: the client
    /// cannot know whether it was booked; not counted as confirmed.
    unknown: u64,
}

/// One `berth serve` on the benchmark's database.
struct Server {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Server {
    async fn start(&mut self) -> Duration {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("berth.log")).expect("log");
        let started = Instant::now();
        let child = Command::new(&self.bin)
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--database", &format!("sqlite://{}", self.dir.join("berth.db").display())])
            .args(["--fleet", &self.dir.join("fleet.toml").display().to_string()])
            .args(["--site-root", &self.dir.display().to_string()])
            .args(["--sim-speed", "0"])
            .env("BERTH_LOG", "warn")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start berth serve");
        self.child = Some(child);
        let client = reqwest::Client::new();
        let ready = format!("http://127.0.0.1:{}/readyz", self.port);
        while started.elapsed() < Duration::from_secs(60) {
            if client.get(&ready).send().await.is_ok_and(|r| r.status().is_success()) {
                return started.elapsed();
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("berth serve exited ({status}); see {}", self.dir.join("berth.log").display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("berth serve was not ready after 60 s; see {}", self.dir.join("berth.log").display());
    }

    /// SIGKILL (what `Child::kill` sends on Unix): no shutdown, no flush, no checkpoint.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL berth serve");
            child.wait().expect("berth serve ended");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The database before the first start: a tenant with one member per client, each with an
/// API token, made through the platform as the Account page would.
async fn prepare(dir: &Path, settings: &Settings) -> Vec<String> {
    std::fs::write(
        dir.join("fleet.toml"),
        format!(
            "[[site]]\nname = \"crash-1\"\n[[site.pool]]\nprefix = \"h100\"\nmodel = \"H100-80GB\"\nnodes = {}\ngpus_per_node = 8\nnvlink = true\n",
            settings.nodes
        ),
    )
    .expect("fleet file");
    let pool = store::connect(&format!("sqlite://{}", dir.join("berth.db").display())).await.expect("connect");
    store::migrate(&pool).await.expect("migrate");
    let platform = Platform::new(pool.clone());
    let tenant = platform.ensure_tenant("crash", "Crash", Isolation::Soft).await.expect("tenant");
    let mut tokens = Vec::new();
    for c in 0..settings.clients {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO users (email, display_name, role, tenant_id, created_at) VALUES (?, ?, 'member', ?, 0) RETURNING id",
        )
        .bind(format!("client{c}@crash"))
        .bind(format!("Client {c}"))
        .bind(tenant)
        .fetch_one(&pool)
        .await
        .expect("user");
        let caller = Caller {
            principal: Principal { user_id: id, tenant_id: Some(tenant), role: Role::Member, token_actions: None },
            meta: RequestMeta { request_id: format!("crash-{c}"), source: None },
        };
        let (_, secret) = platform.create_token(&caller, "crash bench", "1", &[]).await.expect("token");
        tokens.push(secret);
    }
    pool.close().await;
    tokens
}

/// Books until `stop`, through whatever server is up; keeps going across kills.
async fn client(c: usize, url: String, token: String, stop: Arc<AtomicBool>, tally: Arc<Mutex<Tally>>) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().expect("client");
    let mut rng = rand::rngs::StdRng::seed_from_u64(c as u64);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let (offering, size, reservations) = SIZES[rng.random_range(0..SIZES.len())];
        let max_hours = if offering == "notebook" { 24 } else { 72 };
        let start = chrono::Utc::now() + chrono::Duration::hours(rng.random_range(1..(80 * 24)));
        let training = offering == "training";
        let request = serde_json::json!({
            "offering": offering,
            "size": size,
            "name": format!("c{c}-{n}"),
            "hours": rng.random_range(1..=max_hours).to_string(),
            "start": start.to_rfc3339(),
            "image": if training { "ghcr.io/acme/train:1" } else { "" },
            "command": if training { "python train.py" } else { "" },
        });
        n += 1;
        let sent = http
            .post(format!("{url}/api/v1/environments"))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(request.to_string())
            .send()
            .await;
        let answer = match sent {
            Ok(response) => {
                let status = response.status();
                response.text().await.ok().map(|body| (status, body))
            }
            Err(_) => None,
        };
        let mut tally = tally.lock().await;
        match answer {
            Some((status, body)) if status == reqwest::StatusCode::CREATED => {
                let body: serde_json::Value = serde_json::from_str(&body).expect("a 201 answers JSON");
                let id = body["id"].as_str().expect("a 201 names the environment").to_owned();
                tally.confirmed.push(Confirmed { id, reservations });
            }
            Some((status, body)) if status.is_client_error() => {
                let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                let message = body["detail"].as_str().unwrap_or("?");
                // The first words say which refusal (times and sizes follow).
                let what: String = message.split_whitespace().take(6).collect::<Vec<_>>().join(" ");
                *tally.refused.entry(format!("{} {what}", status.as_u16())).or_default() += 1;
            }
            _ => {
                tally.unknown += 1;
                drop(tally);
                // Down: wait for the restart rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn main() {
    let settings = Settings::from_env();
    if settings.smoke {
        println!("smoke run (BENCH_SMOKE=1): a few kills, to prove the benchmark works; the figures mean nothing");
    }
    let bin = std::env::var_os("BERTH_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_berth")), PathBuf::from);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(run(settings, bin));
}

async fn run(settings: Settings, bin: PathBuf) {
    let dir = std::env::temp_dir().join(format!("berth-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let tokens = prepare(&dir, &settings).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("port").port();
    let mut server = Server { bin, dir: dir.clone(), port, child: None };
    let first_start = server.start().await;

    let url = format!("http://127.0.0.1:{port}");
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let clients: Vec<_> = tokens
        .into_iter()
        .enumerate()
        .map(|(c, token)| tokio::spawn(client(c, url.clone(), token, stop.clone(), tally.clone())))
        .collect();

    let mut rng = rand::rngs::StdRng::from_os_rng();
    let started = Instant::now();
    let mut restarts = Vec::new();
    for _ in 0..settings.kills {
        tokio::time::sleep(Duration::from_secs_f64(rng.random_range(settings.uptime.clone()))).await;
        server.kill();
        restarts.push(server.start().await);
    }
    // A little more booking on the last start, then the last kill.
    tokio::time::sleep(Duration::from_secs_f64(settings.uptime.start)).await;
    stop.store(true, Ordering::Relaxed);
    server.kill();
    for c in clients {
        c.await.expect("client");
    }
    let elapsed = started.elapsed().as_secs_f64();

    // Opened as Berth opens it, after the last SIGKILL: SQLite recovers from the WAL.
    let pool = store::connect(&format!("sqlite://{}", dir.join("berth.db").display())).await.expect("reopen");
    let tally = tally.lock().await;
    let mut missing = 0;
    for booking in &tally.confirmed {
        let (environments, reservations): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM environments WHERE id = ?1),
                    (SELECT count(*) FROM reservations WHERE environment_id = ?1 AND released_at IS NULL)",
        )
        .bind(&booking.id)
        .fetch_one(&pool)
        .await
        .expect("look up a confirmed booking");
        if environments != 1 || reservations != booking.reservations {
            eprintln!(
                "confirmed booking {} lost: {environments} environment rows, {reservations} of {} reservations",
                booking.id, booking.reservations
            );
            missing += 1;
        }
    }
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM environments").fetch_one(&pool).await.expect("count");
    let overlaps = overlaps::overlapping_reservations(&pool).await;
    let integrity: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check").fetch_all(&pool).await.expect("check");
    pool.close().await;

    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    let slowest = restarts.iter().max().map_or(0.0, ms);
    let mean = restarts.iter().map(ms).sum::<f64>() / restarts.len().max(1) as f64;
    println!(
        "== crash under load: {} SIGKILLs, {} clients, {} GPUs, {elapsed:.1} s",
        settings.kills,
        settings.clients,
        settings.nodes * 8
    );
    println!(
        "bookings confirmed: {} ({:.1}/s over the run, restarts included); refused: {}; unanswered (killed mid-request or down): {}",
        tally.confirmed.len(),
        tally.confirmed.len() as f64 / elapsed,
        tally.refused.values().sum::<u64>(),
        tally.unknown
    );
    for (what, n) in &tally.refused {
        println!("  refused {n}: {what}...");
    }
    println!("environments stored: {stored} (confirmed ones plus any committed whose answer the kill cut off)");
    println!("start to ready: first {:.0} ms; after a kill mean {mean:.0} ms, max {slowest:.0} ms", ms(&first_start));
    println!("confirmed bookings missing from the database: {missing}");
    println!("reservation pairs closer than the cleaning gap (independent check): {overlaps}");
    println!("PRAGMA integrity_check: {}", integrity.join("; "));
    assert_eq!(missing, 0, "a booking a client saw confirmed was lost");
    assert_eq!(overlaps, 0, "double booking");
    assert_eq!(integrity, ["ok"], "the database is damaged");
    assert!(!tally.confirmed.is_empty(), "no booking was confirmed");
    assert!(stored >= tally.confirmed.len() as i64);
    let _ = std::fs::remove_dir_all(dir);
}
