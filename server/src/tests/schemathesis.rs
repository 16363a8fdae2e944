//! schemathesis (PyPI) against a running Berth: the real router on loopback, its reconciler
//! driving the simulated fleet of `config/fleet.toml`, the demo's tenants and environments,
//! and tokens of two roles (a platform admin, a member of the demo's tenant) plus a node's
//! token for the agents' routes. Every operation of `/api/v1/openapi.json` with
//! `--checks all`: a server error, an answer that breaks the description or a request the
//! description calls valid that Berth cannot read fails it (`e2e/schemathesis_hooks.py`).
//!
//! `make api-fuzz` (part of `make test`) installs schemathesis and runs it; a plain
//! `cargo test` skips it (no Python there).

use std::process::Command;
use std::sync::Arc;

use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::provisioning::backend::simulated::{Simulated, SimulatedConfig};

use super::{Berth, meta};

/// Test cases per operation and phase: enough to find what the description gets wrong,
/// few enough for the whole run to stay within a few minutes on two cores.
const EXAMPLES: &str = "50";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs schemathesis: `make api-fuzz`"]
async fn schemathesis_finds_no_server_error_and_no_broken_answer() {
    let st = std::env::var("BERTH_SCHEMATHESIS").expect("BERTH_SCHEMATHESIS: the `st` command (make api-fuzz)");
    let seed = std::env::var("BERTH_FUZZ_SEED").unwrap_or_else(|_| "14".into());
    let fleet = Arc::new(Simulated::new(SimulatedConfig { speed: 0.0, faults: Vec::new(), volumes_dir: None }));
    // The fuzzer sends thousands of requests from one address with one token.
    let flags = ["--api-rate-limit", "off", "--api-rate-limit-per-address", "off"];
    let spec = include_str!("../../../config/fleet.toml");
    let berth = Berth::start_with(None, spec, Some(fleet), &flags, &[]).await;
    berth.platform.seed_demo().await.expect("demo data");
    let acme = berth.platform.ensure_tenant("acme", "Acme Research", Isolation::Soft).await.expect("the demo's tenant");
    let admin = berth.person("admin@fuzz.example", Role::PlatformAdmin, None).await;
    let member = berth.person("member@fuzz.example", Role::Member, Some(acme)).await;
    let globex = berth.platform.ensure_tenant("globex", "Globex AI", Isolation::Hard).await.expect("the demo's other");
    let other = berth.person("member@globex.example", Role::Member, Some(globex)).await;
    let url = berth.serve_on_loopback().await;
    let (_, node_token) =
        berth.platform.create_node_token(&admin.caller(meta()), "fra1-h100-01").await.expect("node token");

    let description = format!("{url}/api/v1/openapi.json");
    // `(who, token, or none for the peers' configuration, filters)`
    let mut runs: Vec<(String, Option<String>, Vec<&str>)> = Vec::new();
    // Revoking comes last, the platform admin's after the member's: the fuzzer may well
    // revoke the very token it runs with, and an admin anyone's. Removing a member (or
    // changing their role), suspending or deleting a tenant end or narrow their tokens the
    // same way, so they come last too.
    let (_, admin_token) = berth.token(&admin, &[]).await;
    let (_, member_token) = berth.token(&member, &[]).await;
    // Suspending or deleting a tenant ends its people's tokens too: last as well.
    let everything_else =
        vec!["--exclude-path-regex", "^/api/v1/(agent/|tokens/.*/revoke|tenants/[^/]+/members/|tenants/[^/]+$)"];
    let revoking =
        vec!["--include-path-regex", "^/api/v1/(tokens/.*/revoke|tenants/[^/]+/members/|tenants/[^/]+$)", NO_LINKS];
    runs.push(("a platform admin".into(), Some(admin_token.clone()), everything_else.clone()));
    runs.push(("a tenant member".into(), Some(member_token.clone()), everything_else.clone()));
    // Two tenants' members as peers: what one reads of its own, the other must not
    // (schemathesis' object-level authorization check replays each one's reads as the other).
    runs.push(("members of two tenants".into(), None, everything_else));
    runs.push(("a tenant member, revoking".into(), Some(member_token.clone()), revoking.clone()));
    runs.push(("a platform admin, revoking".into(), Some(admin_token), revoking));
    runs.push(("a node agent".into(), Some(node_token), vec!["--include-path-regex", "^/api/v1/agent/", NO_LINKS]));

    // Something of each peer's own to read: a notebook (and with it a home volume), and an
    // SSH key (a token may not add one, so the fuzzer's removals need one there).
    for (person, name) in [(&member, "acme-nb"), (&other, "globex-nb")] {
        berth.launch(person, name).await;
        let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKzNtyR4cmJGDog7LEjOcX9o3mjUze+WPw53Rf+R08s7 fuzz@laptop";
        berth.platform.add_ssh_key(&person.caller(meta()), name, key).await.expect("an SSH key");
    }
    let (_, other_token) = berth.token(&other, &[]).await;
    let dir = tempfile::tempdir().expect("a folder for the peers' files");
    let peers = dir.path().join("peers.json");
    let wfc = serde_json::json!({ "schemaVersion": "0.2.0", "auth": [
        { "name": "acme", "fixedHeaders": [{ "name": "Authorization", "value": format!("Bearer {member_token}") }] },
        { "name": "globex", "fixedHeaders": [{ "name": "Authorization", "value": format!("Bearer {other_token}") }] },
    ]});
    std::fs::write(&peers, wfc.to_string()).expect("peers file");
    let peers_config = dir.path().join("schemathesis.toml");
    let base = std::fs::read_to_string(config_path()).expect("e2e/schemathesis.toml");
    let section = format!("\n[auth.wfc]\npath = \"{}\"\npeers = [\"acme\", \"globex\"]\n", peers.display());
    std::fs::write(&peers_config, base + &section).expect("peers config");
    let peers_config = peers_config.display().to_string();

    let mut failed = Vec::new();
    for (who, token, filter) in runs {
        let (st, description, seed, hooks) = (st.clone(), description.clone(), seed.clone(), hooks_path());
        let config = if token.is_some() { config_path() } else { peers_config.clone() };
        let filter: Vec<String> = filter.into_iter().map(str::to_owned).collect();
        let status = tokio::task::spawn_blocking(move || {
            Command::new(&st)
                .env("SCHEMATHESIS_HOOKS", "schemathesis_hooks")
                .env("PYTHONPATH", hooks)
                .args(["--config-file", &config, "run", &description, "--checks", "all"])
                // One worker: hypothesis reads its strategies' sources with `ast`, which
                // CPython 3.11 can break on from two threads at once ("AST constructor
                // recursion depth mismatch").
                .args(["--max-examples", EXAMPLES, "--seed", &seed, "--workers", "1"])
                .args(token.map(|token| format!("--header=Authorization: Bearer {token}")))
                .args(&filter)
                .status()
        })
        .await
        .expect("schemathesis ran")
        .expect("schemathesis started");
        println!("schemathesis as {who}: {status}");
        if !status.success() {
            failed.push(who);
        }
    }
    assert!(failed.is_empty(), "schemathesis found problems as {failed:?}; its report is above");
}

/// The phases for a run whose operations no link joins (stateful testing needs links).
const NO_LINKS: &str = "--phases=examples,coverage,fuzzing";

/// The folder of `schemathesis_hooks.py`.
fn hooks_path() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../e2e").to_owned()
}

fn config_path() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../e2e/schemathesis.toml").to_owned()
}
