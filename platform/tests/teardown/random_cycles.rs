//! 1,000 random create/stop cycles with injected faults and reconciler crashes leak nothing.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_domain::Refusal;
use berth_domain::lifecycle::EnvState;
use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::capacity::volumes::VolumeRequest;
use berth_platform::tenancy::tenants::TenantChange;
use berth_platform::{Caller, Error};
use rand::Rng;
use rand::seq::IndexedRandom;
use sqlx::SqlitePool;

use crate::common::{overlapping_reservations, tenants_sharing_nodes, test_meta, trigger_abort};
use crate::support::{Site, World};

const CYCLES: usize = 1000;

/// Sizes of each offering the fleet can hold, the small ones more often.
const CHOICES: &[(&str, &str, u32)] = &[
    ("notebook", "h100-1g.10gb", 6),
    ("notebook", "h100-3g.40gb", 3),
    ("notebook", "l40s-1", 3),
    ("notebook", "l40s-dev", 3),
    ("notebook", "h100-1", 2),
    ("training", "h100-1", 3),
    ("training", "h100-4", 2),
    ("training", "h100-8", 1),
    ("training", "a100-8", 1),
    ("inference", "h100-1g.10gb", 4),
    ("inference", "h100-3g.40gb", 2),
    ("inference", "a100-3g.40gb", 2),
    ("inference", "l40s-1", 3),
    ("cluster", "h100-node-1", 1),
    ("cluster", "a100-node-1", 1),
];

#[derive(Default)]
struct Tally {
    launched: AtomicUsize,
    refused: AtomicUsize,
    crashed_requests: AtomicUsize,
    crashes: AtomicUsize,
    tenants_deleted: AtomicUsize,
    volumes: AtomicUsize,
}

/// The tenants members book in; deleted ones leave the list (their members try anyway
/// now and then, and must be refused).
struct Tenants {
    active: Vec<(i64, Vec<Caller>)>,
    deleted: Vec<(i64, Vec<Caller>)>,
    created: usize,
}

async fn random_cycles(site: Site, workers: usize) {
    let name = site.world.name();
    let started = std::time::Instant::now();
    let first_month = berth_domain::metering::Month::of(berth_platform::now_ms());
    let site = Arc::new(site);
    let mut tenants = Tenants { active: Vec::new(), deleted: Vec::new(), created: 0 };
    for (slug, isolation) in [("t0", Isolation::Soft), ("t1", Isolation::Hard), ("t2", Isolation::Soft)] {
        tenants.active.push(site.tenant(slug, isolation, 2).await);
        tenants.created += 1;
    }
    let tenants = Arc::new(Mutex::new(tenants));
    let tally = Arc::new(Tally::default());
    let done = Arc::new(AtomicBool::new(false));
    site.world.faults_on();

    let mut cycles = Vec::new();
    for worker in 0..workers {
        let (site, tenants, tally) = (site.clone(), tenants.clone(), tally.clone());
        cycles.push(tokio::spawn(async move {
            let mut n = 0;
            while tally.launched.load(Ordering::SeqCst) < CYCLES {
                n += 1;
                let (caller, offering, size, moment, pause) = {
                    let tenants = tenants.lock().unwrap();
                    let mut rng = rand::rng();
                    let pool = if rng.random_bool(0.03) && !tenants.deleted.is_empty() {
                        &tenants.deleted
                    } else {
                        &tenants.active
                    };
                    let caller = pool.choose(&mut rng).unwrap().1.choose(&mut rng).unwrap().clone();
                    let &(offering, size, _) = CHOICES.choose_weighted(&mut rng, |c| c.2).unwrap();
                    let pause = Duration::from_millis(rng.random_range(1..30));
                    (caller, offering, size, rng.random_range(0..4u8), pause)
                };
                // Volumes come and go too: a personal one made and attached now and then,
                // one of the caller's deleted now and then (refused while attached).
                let (make_volume, delete_volume) = {
                    let mut rng = rand::rng();
                    (rng.random_bool(0.25), rng.random_bool(0.1))
                };
                if delete_volume {
                    let theirs: Option<i64> = sqlx::query_scalar(
                        "SELECT id FROM volumes WHERE owner_id = ? AND deleted_at IS NULL ORDER BY random() LIMIT 1",
                    )
                    .bind(caller.user_id())
                    .fetch_optional(&site.pool)
                    .await
                    .expect("a volume of the caller");
                    if let Some(id) = theirs
                        && let Err(e) = site.platform().delete_volume(&caller, id).await
                    {
                        assert_eq!(trigger_abort(&e), None, "{name}: a volume's delete reached the database: {e}");
                    }
                }
                let mut volumes = Vec::new();
                if make_volume && matches!(offering, "notebook" | "training") {
                    let request =
                        VolumeRequest { name: format!("v{worker}-{n}"), size_gib: "1".into(), project: String::new() };
                    match site.platform().create_volume(&caller, &request).await {
                        Ok(volume) => {
                            volumes.push(volume.id.to_string());
                            tally.volumes.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => assert_eq!(trigger_abort(&e), None, "{name}: a volume reached the database: {e}"),
                    }
                }
                let launched = site.launch_with(&caller, offering, size, &format!("w{worker}-{n}"), volumes).await;
                let env = match launched {
                    Ok(env) => env,
                    Err(Error::Refused(_)) => {
                        tally.refused.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    Err(e) => {
                        // The process crashed under the request; the client tries again. A
                        // booking the database's trigger refused is no crash but a bug.
                        assert_eq!(trigger_abort(&e), None, "{name}: a launch reached the database: {e}");
                        tally.crashed_requests.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                tally.launched.fetch_add(1, Ordering::SeqCst);
                // Stopped at a random moment: at once, a little later, once ready, or
                // not at all (the window's end would; the convergence below does).
                match moment {
                    0 => {}
                    1 => tokio::time::sleep(pause).await,
                    2 => {
                        let _ = site.wait_for(&env.id, &[EnvState::Ready], Duration::from_millis(500)).await;
                    }
                    _ => {
                        let _ = site.wait_for(&env.id, &[EnvState::Ready], Duration::from_millis(100)).await;
                        tokio::time::sleep(pause / 2).await;
                    }
                }
                if let Err(e) = site.platform().stop(&caller, &env.id).await {
                    assert_eq!(trigger_abort(&e), None, "{name}: a stop reached the database: {e}");
                }
                let _ = site.wait_for(&env.id, &[EnvState::Released, EnvState::Failed], Duration::from_secs(3)).await;
            }
        }));
    }

    // The reconciler's process crashes now and then, wherever it is.
    let crasher = {
        let (site, tally, done) = (site.clone(), tally.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let pause = Duration::from_millis(rand::rng().random_range(150..600));
                tokio::time::sleep(pause).await;
                site.crash().await;
                tally.crashes.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // Tenants come and go; a hard tenant's identifiers must follow.
    let churn = {
        let (site, tenants, tally, done) = (site.clone(), tenants.clone(), tally.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let pause = Duration::from_millis(rand::rng().random_range(300..900));
                tokio::time::sleep(pause).await;
                let victim = {
                    let tenants = tenants.lock().unwrap();
                    tenants.active.choose(&mut rand::rng()).map(|t| t.0)
                };
                let Some(victim) = victim else { continue };
                if let Err(e) = site.platform().change_tenant(&site.admin, victim, TenantChange::Delete).await {
                    assert_eq!(trigger_abort(&e), None, "{name}: a tenant deletion reached the database: {e}");
                    continue; // the process crashed under it; try another later
                }
                tally.tenants_deleted.fetch_add(1, Ordering::SeqCst);
                let number = {
                    let mut tenants = tenants.lock().unwrap();
                    let index = tenants.active.iter().position(|t| t.0 == victim).unwrap();
                    let gone = tenants.active.remove(index);
                    tenants.deleted.push(gone);
                    tenants.created += 1;
                    tenants.created
                };
                let isolation = if number % 2 == 0 { Isolation::Hard } else { Isolation::Soft };
                // A crash may cut a request whose change committed: the next try takes a
                // new name, and the half-answered one stays as it is.
                let mut attempt = 0;
                let fresh = loop {
                    attempt += 1;
                    let slug = format!("t{number}-{attempt}");
                    let platform = site.platform();
                    match platform.create_tenant(&site.admin, &slug, "T", isolation.as_str(), "").await {
                        Ok(t) => break t.id,
                        Err(Error::Refused(Refusal::SlugInUse(_))) => {}
                        Err(Error::Refused(r)) => panic!("tenant {slug}: {r}"),
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                };
                let mut members = Vec::new();
                while members.len() < 2 {
                    attempt += 1;
                    let email = format!("m{attempt}@t{number}.test");
                    let platform = site.platform();
                    match platform.create_user(&email, &email, "a long passphrase", Role::Member, Some(fresh)).await {
                        Ok(user) => members.push(user.caller(test_meta())),
                        Err(Error::Refused(Refusal::EmailInUse(_))) => {}
                        Err(Error::Refused(r)) => panic!("{email}: {r}"),
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                tenants.lock().unwrap().active.push((fresh, members));
            }
        })
    };
    // Checked all along, not only at the end: unreleased reservations never overlap, hard
    // tenants never share a node, and no environment of a deleted tenant is meant to run.
    let monitor = {
        let (pool, done) = (site.pool.clone(), done.clone());
        tokio::spawn(async move {
            let mut checks = 0;
            while !done.load(Ordering::SeqCst) {
                assert_eq!(overlapping_reservations(&pool).await, 0, "overlapping reservations during the run");
                assert_eq!(tenants_sharing_nodes(&pool).await, 0, "a hard tenant shared a node during the run");
                let running: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM environments e JOIN tenants t ON t.id = e.tenant_id
                     WHERE t.status = 'deleted' AND e.desired = 'running' AND e.state NOT IN ('released', 'failed')",
                )
                .fetch_one(&pool)
                .await
                .expect("checker");
                assert_eq!(running, 0, "an environment of a deleted tenant is meant to run");
                assert_volumes_held(&pool, "during the run").await;
                checks += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            checks
        })
    };

    for cycle in cycles {
        cycle.await.expect("worker");
    }
    done.store(true, Ordering::SeqCst);
    crasher.await.expect("crasher");
    churn.await.expect("churn");
    let checks = monitor.await.expect("monitor");

    // Faults off: everything converges, late effects land, the sweep cleans up.
    site.world.faults_off();
    site.converge(Duration::from_secs(30)).await;
    site.world.quiesce().await;
    let report = site.reconciler().sweep().await.expect("final sweep");
    site.assert_clean().await;
    assert_volumes_held(&site.pool, "at the end").await;
    // Everything released: no volume attached; a deleted tenant keeps no volume; every
    // deleted volume's storage is gone from the backend.
    let attached = site.count("SELECT count(*) FROM volume_attachments WHERE detached_at IS NULL").await;
    assert_eq!(attached, 0, "{name}: a volume is still attached after everything was released");
    let kept = site
        .count(
            "SELECT count(*) FROM volumes v JOIN tenants t ON t.id = v.tenant_id
             WHERE t.status = 'deleted' AND (v.deleted_at IS NULL OR v.storage_removed_at IS NULL)",
        )
        .await;
    assert_eq!(kept, 0, "{name}: a deleted tenant's volume is left");
    if let World::Simulated(simulated) = &site.world {
        let deleted: Vec<i64> = sqlx::query_scalar("SELECT id FROM volumes WHERE deleted_at IS NOT NULL")
            .fetch_all(&site.pool)
            .await
            .expect("deleted volumes");
        let left: Vec<i64> = deleted.into_iter().filter(|id| simulated.volume_dir(*id).exists()).collect();
        assert_eq!(left, Vec::<i64>::new(), "{name}: deleted volumes' directories are left");
        // And none lost while it exists: every live volume once made keeps its directory.
        // Made means a workload that mounts it started; a location alone is written before
        // the start step, which a fault or a stop may cut before it makes anything.
        let live: Vec<i64> = sqlx::query_scalar(
            "SELECT DISTINCT v.id FROM volumes v
             JOIN volume_attachments a ON a.volume_id = v.id
             JOIN environment_steps s ON s.environment_id = a.environment_id
             WHERE v.deleted_at IS NULL AND s.step = 'start_workload' AND s.status = 'succeeded'",
        )
        .fetch_all(&site.pool)
        .await
        .expect("live volumes");
        let lost: Vec<i64> = live.into_iter().filter(|id| !simulated.volume_dir(*id).exists()).collect();
        assert_eq!(lost, Vec::<i64>::new(), "{name}: live volumes lost their directories");
    }
    let volumes_made = site.count("SELECT count(*) FROM volumes").await;
    assert!(volumes_made > 50, "{name}: only {volumes_made} volumes were made");

    let stat = |sql: &str| {
        let pool = site.pool.clone();
        let sql = sql.to_owned();
        async move { sqlx::query_scalar::<_, i64>(&sql).fetch_one(&pool).await.expect("stat") }
    };
    let failed = stat("SELECT count(*) FROM environments WHERE state = 'failed'").await;
    let retried = stat("SELECT count(*) FROM environment_steps WHERE attempts > 1").await;
    let swept = stat("SELECT count(*) FROM audit_events WHERE action = 'orphan.remove' AND outcome = 'success'").await;
    let environments = stat("SELECT count(*) FROM environments").await;
    let kinds: Vec<(String, i64)> = sqlx::query_as(
        "SELECT substr(target, 1, instr(target, ' ') - 1), count(*) FROM audit_events
         WHERE action = 'orphan.remove' AND outcome = 'success' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&site.pool)
    .await
    .expect("kinds");
    eprintln!(
        "{name}: {} cycles ({environments} environments, {failed} failed, {retried} steps retried), {} refused, \
         {} requests cut by {} crashes, {} tenants deleted, {swept} orphans swept {kinds:?} ({} in the final sweep), \
         {checks} checks during the run, {} volumes made besides homes, {:.1} s",
        tally.launched.load(Ordering::SeqCst),
        tally.refused.load(Ordering::SeqCst),
        tally.crashed_requests.load(Ordering::SeqCst),
        tally.crashes.load(Ordering::SeqCst),
        tally.tenants_deleted.load(Ordering::SeqCst),
        report.removed.len(),
        tally.volumes.load(Ordering::SeqCst),
        started.elapsed().as_secs_f64(),
    );
    ledger_agrees_with_reservations(&site, first_month).await;
    // The faults really happened.
    assert!(tally.launched.load(Ordering::SeqCst) >= CYCLES);
    assert!(failed > 0 && retried > 0, "{name}: no step failed or was retried");
    assert!(tally.crashes.load(Ordering::SeqCst) > 0 && tally.tenants_deleted.load(Ordering::SeqCst) > 0);
    assert!(swept > 0, "{name}: no orphan was ever made and swept");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_thousand_random_cycles_leak_nothing_on_the_simulated_backend(pool: SqlitePool) {
    random_cycles(Site::new(pool, World::simulated(vec![])).await, 12).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_thousand_random_cycles_leak_nothing_on_kubernetes(pool: SqlitePool) {
    random_cycles(Site::new(pool, World::kubernetes()).await, 12).await;
}

/// Volumes as an independent reading of the tables sees them: never attached to another
/// tenant's environment, never attached to two tenants' environments at once, never
/// deleted (nor its storage removed) while an environment has it attached, and never
/// attached to an environment that has ended.
async fn assert_volumes_held(pool: &SqlitePool, when: &str) {
    let count = |sql: &'static str| async move { sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await.expect(sql) };
    let foreign = count(
        "SELECT count(*) FROM volume_attachments a JOIN volumes v ON v.id = a.volume_id
           JOIN environments e ON e.id = a.environment_id
         WHERE a.detached_at IS NULL AND coalesce(v.tenant_id, -1) <> coalesce(e.tenant_id, -1)",
    )
    .await;
    assert_eq!(foreign, 0, "a volume attached to another tenant's environment {when}");
    let two_tenants = count(
        "SELECT count(*) FROM volume_attachments a JOIN volume_attachments b ON b.volume_id = a.volume_id AND a.id < b.id
           JOIN environments ea ON ea.id = a.environment_id JOIN environments eb ON eb.id = b.environment_id
         WHERE a.detached_at IS NULL AND b.detached_at IS NULL
           AND coalesce(ea.tenant_id, -1) <> coalesce(eb.tenant_id, -1)",
    )
    .await;
    assert_eq!(two_tenants, 0, "a volume attached to two tenants' environments at once {when}");
    let lost = count(
        "SELECT count(*) FROM volume_attachments a JOIN volumes v ON v.id = a.volume_id
         WHERE a.detached_at IS NULL AND (v.deleted_at IS NOT NULL OR v.storage_removed_at IS NOT NULL)",
    )
    .await;
    assert_eq!(lost, 0, "a volume deleted while attached {when}");
    let ended = count(
        "SELECT count(*) FROM volume_attachments a JOIN environments e ON e.id = a.environment_id
         WHERE a.detached_at IS NULL AND e.state IN ('released', 'failed')",
    )
    .await;
    assert_eq!(ended, 0, "an ended environment holds a volume {when}");
}

/// The usage ledger's GPU-hours per environment (through the platform's report) against an
/// independent count: plain SQL over reservations and the environments' history (when
/// their GPUs were first held), with MIG profiles' shares written out here.
async fn ledger_agrees_with_reservations(site: &Site, first_month: berth_domain::metering::Month) {
    use berth_platform::capacity::metering::UsageBy;
    let now = berth_platform::now_ms();
    let expected: Vec<(String, f64)> = sqlx::query_as(
        "SELECT e.id, sum(
             max(0, min(coalesce(r.released_at, ?1), r.ends_at) - max(e.held_at, r.starts_at))
             * CASE r.mig_profile WHEN '1g' THEN 1 WHEN '1g+me' THEN 1 WHEN '1g.2m' THEN 1 WHEN '2g' THEN 2
                   WHEN '3g' THEN 3 WHEN '4g' THEN 4 WHEN '7g' THEN 7 ELSE r.slice_size * 7.0 / 8 END / 7.0
             / 3600000.0)
         FROM environments e JOIN reservations r ON r.environment_id = e.id
         WHERE e.held_at IS NOT NULL GROUP BY e.id HAVING sum(min(coalesce(r.released_at, ?1), r.ends_at) > max(e.held_at, r.starts_at)) > 0",
    )
    .bind(now)
    .fetch_all(&site.pool)
    .await
    .expect("independent count");
    let mut ledger = std::collections::BTreeMap::<String, f64>::new();
    let mut summed_hours = 0.0;
    let mut month = first_month;
    while month <= berth_domain::metering::Month::of(now) {
        let report =
            site.platform().usage_report(&site.admin, month, UsageBy::Environment, None).await.expect("report");
        for line in report.lines {
            *ledger.entry(line.key).or_default() += line.gpu_hours;
        }
        // Lines by tenant count released units from their sums.
        let by_tenant = site.platform().usage_report(&site.admin, month, UsageBy::Tenant, None).await.expect("report");
        summed_hours += by_tenant.total_gpu_hours;
        month = month.next();
    }
    // Every release, crashed requests and restarts included, summed its units with it.
    let unsummed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM usage_ledger l JOIN reservations r ON r.id = l.reservation_id
         WHERE r.released_at IS NOT NULL AND l.summed = 0",
    )
    .fetch_one(&site.pool)
    .await
    .expect("unsummed units");
    assert_eq!(unsummed, 0, "released units left unsummed");
    let expected_hours: f64 = expected.iter().map(|(_, h)| h).sum();
    assert!(
        (summed_hours - expected_hours).abs() < 1e-6,
        "the sums count {summed_hours} GPU-h, the reservations {expected_hours} GPU-h"
    );
    assert!(expected.len() > 100, "only {} environments ever held GPUs", expected.len());
    let mut disagree = Vec::new();
    for (id, hours) in &expected {
        let counted = ledger.remove(id).unwrap_or(0.0);
        if (counted - hours).abs() > 1e-9 {
            disagree.push(format!("{id}: ledger {counted} GPU-h, reservations {hours} GPU-h"));
        }
    }
    disagree.extend(ledger.iter().filter(|(_, h)| **h > 0.0).map(|(id, h)| format!("{id}: ledger only, {h} GPU-h")));
    assert!(disagree.is_empty(), "the ledger disagrees with the reservations:\n{}", disagree.join("\n"));
}
