//! `berthctl`, the real binary, against this Berth on loopback: the demo's fleet and data, an
//! instant simulated fleet behind the reconciler, a member's token. Login, the catalog and
//! availability, a booking (and its retry under one key), the listing, show, extend, idle and
//! keep, a training job's log followed to its end, SSH to a dedicated cluster, stop; tables
//! and JSON; a refusal, a bad and an expired token, each with its message and exit status.
//!
//! The binary is built beside this test's (`make unit` and `make test` build it first:
//! `cargo build -p berthctl`); the test says so when it is missing.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use berth_platform::provisioning::backend::simulated::{Simulated, SimulatedConfig};
use serde_json::Value;

use super::{Berth, meta};

/// `berthctl` in the target directory this test binary was built in (`…/debug/deps/..`),
/// or where `BERTHCTL` says.
fn berthctl_path() -> PathBuf {
    if let Some(path) = std::env::var_os("BERTHCTL") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let path = profile.join(if cfg!(windows) { "berthctl.exe" } else { "berthctl" });
    assert!(
        path.exists(),
        "{} is missing: build it first with `cargo build -p berthctl` (make test does)",
        path.display()
    );
    path
}

/// Runs berthctl with its own config directory and no `BERTH_*` from the environment.
struct Ctl {
    bin: PathBuf,
    home: tempfile::TempDir,
}

/// What one run printed and how it ended.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }

    fn ok(self, what: &str) -> Run {
        assert_eq!(self.code, 0, "{what} failed: {}{}", self.stdout, self.stderr);
        self
    }
}

impl Ctl {
    fn new() -> Ctl {
        Ctl { bin: berthctl_path(), home: tempfile::tempdir().expect("home") }
    }

    async fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        self.run_with_input(args, env, "").await
    }

    /// As [`Ctl::run`], with `input` on its standard input.
    async fn run_with_input(&self, args: &[&str], env: &[(&str, &str)], input: &str) -> Run {
        let mut command = std::process::Command::new(&self.bin);
        command
            .args(args)
            .env_remove("BERTH_URL")
            .env_remove("BERTH_TOKEN")
            .env("HOME", self.home.path())
            .env("XDG_CONFIG_HOME", self.home.path().join("config"));
        for (name, value) in env {
            command.env(name, value);
        }
        let asked = format!("{args:?}");
        // Off the runtime's threads: the server this talks to runs on them.
        let input = input.to_owned();
        let output = tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut child = command
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(input.as_bytes())?;
            }
            child.wait_with_output()
        });
        let Output { status, stdout, stderr } = tokio::time::timeout(std::time::Duration::from_secs(60), output)
            .await
            .unwrap_or_else(|_| panic!("berthctl {asked} did not end in 60 s"))
            .expect("joined")
            .expect("berthctl runs");
        Run {
            code: status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        }
    }

    fn config_file(&self) -> PathBuf {
        self.home.path().join("config").join("berth").join("config.json")
    }
}

/// Polls `berthctl show` until the environment is in `state`.
async fn until_state(ctl: &Ctl, id: &str, state: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let env = ctl.run(&["show", id, "-o", "json"], &[]).await.ok("show").json();
        if env["state"] == state {
            return env;
        }
        assert!(std::time::Instant::now() < deadline, "{id} stuck in {}", env["state"]);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berthctl_books_lists_extends_and_stops_against_a_real_berth() {
    let fleet = Arc::new(Simulated::new(SimulatedConfig { speed: 0.0, faults: Vec::new(), volumes_dir: None }));
    let spec = include_str!("../../../config/fleet.toml");
    let berth = Berth::start_with(None, spec, Some(fleet), &[], &[]).await;
    berth.platform.seed_demo().await.expect("demo data");
    let acme = berth.platform.ensure_tenant("acme", "Acme Research", Isolation::Soft).await.expect("the demo's tenant");
    let member = berth.person("cli@acme.example", Role::Member, Some(acme)).await;
    let (token_info, token) = berth.token(&member, &[]).await;
    let url = berth.serve_on_loopback().await;
    let ctl = Ctl::new();

    // Before login: told what to do, as "not signed in".
    let before = ctl.run(&["ls"], &[]).await;
    assert_eq!(before.code, 3, "{}", before.stderr);
    assert!(before.stderr.contains("berthctl login"), "{}", before.stderr);

    // Login checks the token and keeps it owner-only.
    let login = ctl.run(&["login", "--url", &url, "--with-token", &token], &[]).await.ok("login");
    assert!(login.stdout.contains("Signed in to") && login.stdout.contains("member"), "{}", login.stdout);
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(ctl.config_file()).expect("config")).expect("json");
    assert_eq!((saved["url"].as_str(), saved["token"].as_str()), (Some(url.as_str()), Some(token.as_str())));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(ctl.config_file()).expect("config").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the token's file is its owner's only");
    }

    // A token pasted when asked works the same.
    let pasted = Ctl::new();
    let login = pasted.run_with_input(&["login", "--url", &url], &[], &format!("{token}\n")).await.ok("pasted");
    assert!(login.stderr.contains(&format!("{url}/account")), "says where to make one: {}", login.stderr);
    assert!(pasted.run(&["ls"], &[]).await.ok("ls after pasting").stdout.starts_with("ID"));

    // The catalog and its availability.
    let catalog = ctl.run(&["catalog", "notebook"], &[]).await.ok("catalog");
    assert!(catalog.stdout.starts_with("OFFERING"), "{}", catalog.stdout);
    assert!(catalog.stdout.contains("h100-1g.10gb") && catalog.stdout.contains("/h"), "{}", catalog.stdout);
    assert!(!catalog.stdout.contains("training"), "only notebooks: {}", catalog.stdout);
    let free = ctl.run(&["availability", "notebook", "--hours", "2", "-o", "json"], &[]).await.ok("availability");
    let free = free.json();
    let slice = free["sizes"].as_array().expect("sizes").iter().find(|s| s["size"] == "h100-1g.10gb").cloned();
    assert!(slice.is_some_and(|s| s["free"].as_u64() > Some(0)), "{free}");

    // A booking, and its retry under the same key, which books nothing more.
    let book = ["book", "notebook", "h100-1g.10gb", "--hours", "2", "--name", "cli-nb", "--idempotency-key"];
    let booked = ctl.run(&[&book[..], &["cli-key-1", "-o", "json"]].concat(), &[]).await.ok("book").json();
    let id = booked["id"].as_str().expect("id").to_owned();
    let again = ctl.run(&[&book[..], &["cli-key-1", "-o", "json"]].concat(), &[]).await.ok("book again").json();
    assert_eq!(again["id"], booked["id"], "the same key books once");
    let table = ctl.run(&["book", "notebook", "h100-1g.10gb", "--hours", "1", "--name", "cli-nb-2"], &[]).await;
    let table = table.ok("book as a table");
    assert!(table.stdout.starts_with("Booked cli-nb-2 ("), "{}", table.stdout);

    // Listed, as a table and as JSON.
    let ls = ctl.run(&["ls"], &[]).await.ok("ls");
    assert!(ls.stdout.starts_with("ID") && ls.stdout.contains(&id) && ls.stdout.contains("cli-nb"), "{}", ls.stdout);
    let listed = ctl.run(&["ls", "-o", "json"], &[]).await.ok("ls json").json();
    let names: Vec<&str> =
        listed["environments"].as_array().expect("list").iter().filter_map(|e| e["name"].as_str()).collect();
    assert!(names.contains(&"cli-nb") && names.contains(&"cli-nb-2"), "{names:?}");

    // Show, open, extend by an hour.
    let ready = until_state(&ctl, &id, "ready").await;
    let show = ctl.run(&["show", &id], &[]).await.ok("show");
    assert!(show.stdout.contains("state") && show.stdout.contains("ready"), "{}", show.stdout);
    let open = ctl.run(&["open", &id], &[]).await.ok("open");
    assert!(open.stdout.trim().ends_with("/lab"), "{}", open.stdout);
    let end = |env: &Value| chrono::DateTime::parse_from_rfc3339(env["ends_at"].as_str().expect("end")).expect("time");
    let extended = ctl.run(&["extend", &id, "--hours", "1", "-o", "json"], &[]).await.ok("extend").json();
    assert_eq!(end(&extended) - end(&ready), chrono::TimeDelta::hours(1), "{extended}");

    // The demo's idle policy for notebooks applies (two keeps); keeping it uses one.
    let idle = ctl.run(&["idle", &id], &[]).await.ok("idle");
    assert!(idle.stdout.contains("policy") && idle.stdout.contains("GPUs under 5%"), "{}", idle.stdout);
    assert!(idle.stdout.lines().any(|l| l.starts_with("keeps left") && l.ends_with(" 2")), "{}", idle.stdout);
    let kept = ctl.run(&["keep", &id, "-o", "json"], &[]).await.ok("keep").json();
    assert_eq!((kept["keeps_used"].as_i64(), kept["keeps_left"].as_i64()), (Some(1), Some(1)), "{kept}");
    let kept = ctl.run(&["keep", &id], &[]).await.ok("keep again");
    assert!(kept.stdout.starts_with(&format!("Kept {id}")), "{}", kept.stdout);
    let no_more = ctl.run(&["keep", &id], &[]).await;
    assert_eq!(no_more.code, 6, "past the policy's keeps: refused in words: {}", no_more.stderr);

    // A notebook has no log and no SSH: refused in words (6), and a usage mistake (2).
    let no_log = ctl.run(&["logs", &id], &[]).await;
    assert_eq!(no_log.code, 6, "{}", no_log.stderr);
    assert!(
        no_log.stderr.contains("only training jobs do") && no_log.stderr.contains("request id"),
        "{}",
        no_log.stderr
    );
    let no_ssh = ctl.run(&["ssh", &id, "--print"], &[]).await;
    assert_eq!(no_ssh.code, 2, "{}", no_ssh.stderr);

    // Stop.
    let stop = ctl.run(&["stop", &id], &[]).await.ok("stop");
    assert!(stop.stdout.starts_with("Stopping cli-nb ("), "{}", stop.stdout);
    until_state(&ctl, &id, "released").await;

    // A training job's log, followed to its end.
    let job = ctl
        .run(
            &[
                "book",
                "training",
                "h100-1",
                "--hours=1",
                "--image=nvcr.io/nvidia/pytorch:24.10-py3",
                "--command=python train.py --epochs 3",
                "-o=json",
            ],
            &[],
        )
        .await
        .ok("book a job")
        .json();
    let job_id = job["id"].as_str().expect("job id").to_owned();
    let followed = ctl.run(&["logs", &job_id, "--follow"], &[]).await.ok("logs --follow");
    let lines: Vec<&str> = followed.stdout.lines().collect();
    assert!(lines.contains(&"epoch 3/3: loss 0.4159") && lines.contains(&"training finished"), "{}", followed.stdout);
    assert_eq!(lines.iter().filter(|l| l.starts_with("epoch 1/3")).count(), 1, "each line once: {}", followed.stdout);
    assert!(followed.stderr.contains("job succeeded"), "{}", followed.stderr);

    // A dedicated cluster's node over SSH (the simulated fleet's connection details).
    let cluster = ctl.run(&["book", "cluster", "h100-node-1", "--hours", "1", "-o", "json"], &[]).await.ok("cluster");
    let cluster_id = cluster.json()["id"].as_str().expect("cluster id").to_owned();
    until_state(&ctl, &cluster_id, "ready").await;
    let ssh = ctl.run(&["ssh", &cluster_id, "--print", "--", "-L", "8888:localhost:8888"], &[]).await.ok("ssh");
    assert!(ssh.stdout.starts_with("ssh ubuntu@fra1-h100-"), "{}", ssh.stdout);
    assert!(ssh.stdout.trim_end().ends_with(".berth.example -L 8888:localhost:8888"), "{}", ssh.stdout);

    // A rule's refusal: the server's words, the request id, exit status 6.
    let refused = ctl.run(&["book", "notebook", "h100-1g.10gb", "--hours", "99"], &[]).await;
    assert_eq!(refused.code, 6, "{}", refused.stderr);
    assert!(
        refused.stderr.starts_with("berthctl: refused: duration must be a whole number of hours between 1 and 24"),
        "{}",
        refused.stderr
    );
    assert!(refused.stderr.contains("(request id "), "{}", refused.stderr);

    // SSH keys: listed and removed with the token; adding is the account page's.
    let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKzNtyR4cmJGDog7LEjOcX9o3mjUze+WPw53Rf+R08s7 cli@laptop";
    let added = berth.platform.add_ssh_key(&member.caller(meta()), "", key).await.expect("key");
    let keys = ctl.run(&["keys"], &[]).await.ok("keys");
    assert!(keys.stdout.contains("cli@laptop") && keys.stdout.contains("SHA256:"), "{}", keys.stdout);
    ctl.run(&["keys", "remove", &added.id.to_string()], &[]).await.ok("keys remove");
    let keys = ctl.run(&["keys", "-o", "json"], &[]).await.ok("keys json").json();
    assert_eq!(keys["ssh_keys"], serde_json::json!([]), "removed");
    let add = ctl.run(&["keys", "add", "id.pub"], &[]).await;
    assert_eq!(add.code, 4, "{}", add.stderr);
    assert!(add.stderr.contains("/account"), "{}", add.stderr);

    // A wrong token (from the environment, over the saved one) and an expired one.
    let wrong = ctl.run(&["ls"], &[("BERTH_TOKEN", "berth_not-a-token")]).await;
    assert_eq!(wrong.code, 3, "{}", wrong.stderr);
    assert!(wrong.stderr.contains("not signed in") && wrong.stderr.contains("berthctl login"), "{}", wrong.stderr);
    sqlx::query("UPDATE api_tokens SET created_at = 1, expires_at = 2 WHERE id = ?")
        .bind(token_info.id)
        .execute(berth.platform.db())
        .await
        .expect("expire the token");
    let expired = ctl.run(&["ls"], &[]).await;
    assert_eq!(expired.code, 3, "{}", expired.stderr);
    assert!(expired.stderr.contains("revoked or expired"), "{}", expired.stderr);

    // Nobody there: a distinct status.
    let gone = ctl.run(&["ls"], &[("BERTH_URL", "http://127.0.0.1:9")]).await;
    assert_eq!(gone.code, 8, "{}", gone.stderr);

    let completions = ctl.run(&["completions", "bash"], &[]).await.ok("completions");
    assert!(completions.stdout.contains("berthctl"), "a bash completion script");
}
