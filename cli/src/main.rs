//! `berthctl`: Berth's JSON API (`/api/v1`) from a terminal. Book GPU environments, list,
//! show, extend and stop them, follow a training job's log, reach a dedicated cluster over
//! SSH and open a notebook. Every command is one or two API calls; the server decides and
//! its refusals are printed as it words them, with the request id.

// A command line's output is its product.
#![allow(clippy::print_stdout)]

mod client;
mod config;
mod output;

use std::io::{BufRead, Write};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};

use client::{Api, Failure};
use output::{fields, table, text, when};

#[derive(Parser)]
#[command(name = "berthctl", version, about = "Book and manage GPU environments on Berth")]
struct Cli {
    /// The portal's address, e.g. https://berth.example.com (else the one `login` saved).
    #[arg(long, env = "BERTH_URL", global = true)]
    url: Option<String>,
    /// An API token (else the one `login` saved).
    #[arg(long, env = "BERTH_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// Tables for people, or the API's JSON for scripts.
    #[arg(long, short, value_enum, default_value = "table", global = true)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Save the portal's address and an API token (made on the account page), checked first.
    Login {
        /// Otherwise pasted when asked (read from standard input).
        #[arg(long = "with-token", value_name = "TOKEN")]
        with_token: Option<String>,
        /// Open the account page, where tokens are made, in the browser first.
        #[arg(long)]
        browser: bool,
    },
    /// Offerings, their sizes and prices.
    Catalog {
        /// Only this offering (`notebook`, `training`, `inference`, `cluster`).
        offering: Option<String>,
    },
    /// How many of each size fit now (or from --start) for --hours, else the earliest start.
    Availability {
        offering: String,
        #[arg(long, default_value = "1")]
        hours: String,
        /// A UTC date and time (`2026-11-26 14:00`); empty or absent: now.
        #[arg(long, default_value = "")]
        start: String,
        /// The project (its id) whose budget counts too, as `book --project` takes it.
        #[arg(long, default_value = "")]
        project: String,
    },
    /// Book an environment.
    Book(Box<Book>),
    /// Your environments (a tenant admin's: the tenant's).
    Ls {
        /// `active`, `finished` or `any`.
        #[arg(long, default_value = "active")]
        state: String,
    },
    /// One environment.
    Show { id: String },
    /// Stop an environment, or cancel a booking that has not started.
    Stop { id: String },
    /// Move an environment's end later (or earlier).
    Extend {
        id: String,
        /// Hours more than its end now.
        #[arg(long, conflicts_with = "to", required_unless_present = "to")]
        hours: Option<u32>,
        /// A new end, a UTC date and time (`2026-11-26 18:00`).
        #[arg(long)]
        to: Option<String>,
    },
    /// A training job's status and the end of its log.
    Logs {
        id: String,
        /// The last this many lines (at most 10,000: what Berth keeps of a log).
        #[arg(long, default_value = "200")]
        tail: u32,
        /// Keep printing new lines until the job ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// Where an environment stands with the idle watcher: the policy, a warning, keeps left.
    Idle { id: String },
    /// Say an idle environment is in use ("Keep it"): its idle clock starts again.
    Keep { id: String },
    /// SSH to a dedicated cluster's node, with the command its connection details give.
    Ssh {
        id: String,
        /// Print the command instead of running it.
        #[arg(long)]
        print: bool,
        /// More arguments for ssh (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Print a notebook's (or an endpoint's) URL.
    Open {
        id: String,
        /// Also open it in the browser, through the portal's sign-in.
        #[arg(long)]
        browser: bool,
    },
    /// Your SSH keys.
    Keys {
        #[command(subcommand)]
        command: Option<Keys>,
    },
    /// A shell completion script, e.g.
    /// `berthctl completions bash > ~/.local/share/bash-completion/completions/berthctl`.
    Completions { shell: clap_complete::Shell },
}

#[derive(clap::Args)]
struct Book {
    /// `notebook`, `training`, `inference` or `cluster`.
    offering: String,
    /// A size's id from `berthctl catalog`, e.g. `h100-1g.10gb`.
    size: String,
    /// Lowercase letters, digits and hyphens; a name is made up when absent.
    #[arg(long)]
    name: Option<String>,
    /// Whole hours.
    #[arg(long)]
    hours: u32,
    /// `now`, `asap` (the earliest start within --within-days) or a UTC date and time
    /// (`2026-11-26 14:00`).
    #[arg(long, default_value = "now")]
    start: String,
    /// With `--start asap`: how many days ahead to look.
    #[arg(long, default_value = "7")]
    within_days: u32,
    /// Other GPU models the booking may take (`A100-80GB,H100-80GB` or `any`).
    #[arg(long, default_value = "")]
    models: String,
    /// The project's id whose quota the booking counts against.
    #[arg(long, default_value = "")]
    project: String,
    /// A volume's id to attach (repeat for more).
    #[arg(long = "volume")]
    volumes: Vec<i64>,
    /// A container image (training jobs and endpoints; notebooks take the catalog's).
    #[arg(long, default_value = "")]
    image: String,
    /// A training job's command.
    #[arg(long, default_value = "")]
    command: String,
    /// An endpoint's model (a Hugging Face id or a path in the image).
    #[arg(long, default_value = "")]
    model: String,
    /// An endpoint's model server arguments, one line (`--args "--max-model-len 8192"`).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    args: String,
    /// An endpoint's environment variable, `NAME=value` (repeat for more).
    #[arg(long = "env")]
    env: Vec<String>,
    /// `guaranteed` or `spot`.
    #[arg(long, default_value = "")]
    tier: String,
    /// Makes a retry safe: the same key with the same request books once. A new one is
    /// made when absent (and reused by the automatic retries).
    #[arg(long)]
    idempotency_key: Option<String>,
}

#[derive(Subcommand)]
enum Keys {
    /// List them (the default).
    List,
    /// Keys are added on the account page: berthctl says where.
    Add {
        /// The public key file, e.g. ~/.ssh/id_ed25519.pub.
        file: Option<String>,
    },
    /// Remove one by id.
    Remove { id: i64 },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("berthctl: {failure}");
            ExitCode::from(u8::try_from(failure.code()).unwrap_or(1))
        }
    }
}

/// What a command prints: `json` for `--output json`, `table` otherwise.
fn print(output: Output, json: &Value, table: impl FnOnce() -> String) {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(json).unwrap_or_default()),
        Output::Table => print!("{}", table()),
    }
}

fn run(cli: Cli) -> Result<(), Failure> {
    let out = cli.output;
    match &cli.command {
        Command::Completions { shell } => {
            clap_complete::generate(*shell, &mut Cli::command(), "berthctl", &mut std::io::stdout());
            return Ok(());
        }
        Command::Login { with_token, browser } => return login(&cli, with_token.clone(), *browser),
        _ => {}
    }
    let api = connect(&cli)?;
    match cli.command {
        Command::Login { .. } | Command::Completions { .. } => Ok(()),
        Command::Catalog { offering } => {
            let catalog = api.get("/api/v1/catalog")?;
            let offerings: Vec<&Value> = items(&catalog, "offerings")
                .into_iter()
                .filter(|o| offering.as_deref().is_none_or(|id| o["id"] == id))
                .collect();
            if let Some(id) = offering.as_deref().filter(|_| offerings.is_empty()) {
                return Err(Failure::Usage(format!("there is no offering called \"{id}\"")));
            }
            let shown = json!({ "offerings": offerings });
            print(out, &shown, || {
                let rows: Vec<Vec<String>> = offerings
                    .iter()
                    .flat_map(|o| {
                        items(o, "sizes").into_iter().map(move |s| {
                            vec![
                                text(o, "id"),
                                text(s, "id"),
                                text(s, "label"),
                                text(s, "vcpus"),
                                text(s, "memory_gb"),
                                text(s, "price"),
                            ]
                        })
                    })
                    .collect();
                table(&["OFFERING", "SIZE", "WHAT", "VCPUS", "MEMORY GB", "PRICE"], &rows)
            });
            Ok(())
        }
        Command::Availability { offering, hours, start, project } => {
            let query = [("offering", offering), ("hours", hours), ("start", start), ("project", project)];
            let answer = api.get_query("/api/v1/availability", &query)?;
            print(out, &answer, || {
                let rows: Vec<Vec<String>> = items(&answer, "sizes")
                    .into_iter()
                    .map(|s| {
                        let budget = s["over_budget"].as_str();
                        let earliest = match (s["free"].as_u64().unwrap_or(0), when(s, "earliest_start")) {
                            (_, t) if t.is_empty() => "none within the booking horizon".to_owned(),
                            (0, t) => t,
                            _ if budget.is_some() => when(s, "earliest_start"),
                            _ => "as asked".to_owned(),
                        };
                        let earliest = match budget {
                            Some(why) => format!("{earliest} (over budget before: {why})"),
                            None => earliest,
                        };
                        vec![text(s, "size"), text(s, "label"), text(s, "free"), earliest]
                    })
                    .collect();
                let mut head = format!(
                    "{} for {} h from {}\n",
                    text(&answer, "offering"),
                    text(&answer, "hours"),
                    when(&answer, "from")
                );
                head.push_str(&table(&["SIZE", "WHAT", "FREE", "EARLIEST START"], &rows));
                head
            });
            Ok(())
        }
        Command::Book(book) => {
            let key = book.idempotency_key.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            // Made from the key, so that a retry under it is the same request.
            let name = book.name.clone().unwrap_or_else(|| {
                let tail: String =
                    key.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_lowercase()).take(6).collect();
                format!("{}-{}", book.offering.trim(), if tail.is_empty() { "x".into() } else { tail })
            });
            let (start, within) = match book.start.trim() {
                "" | "now" => (String::new(), String::new()),
                "asap" => (String::new(), book.within_days.to_string()),
                at => (at.to_owned(), String::new()),
            };
            let body = json!({
                "offering": book.offering, "size": book.size, "name": name, "hours": book.hours.to_string(),
                "start": start, "earliest_within_days": within, "models": book.models,
                "project": book.project, "volumes": book.volumes, "image": book.image,
                "command": book.command, "tier": book.tier, "model": book.model, "args": book.args,
                "env": book.env.join("\n"),
            });
            let env = api.post_once("/api/v1/environments", &body, &key)?;
            print(out, &env, || {
                format!(
                    "Booked {} ({}): {} from {} to {}, {}\n",
                    text(&env, "name"),
                    text(&env, "id"),
                    text(&env, "size"),
                    when(&env, "starts_at"),
                    when(&env, "ends_at"),
                    text(&env, "state")
                )
            });
            Ok(())
        }
        Command::Ls { state } => {
            let list = api.get_all("/api/v1/environments", &[("state", state)], "environments")?;
            print(out, &list, || {
                let rows: Vec<Vec<String>> = items(&list, "environments")
                    .into_iter()
                    .map(|e| {
                        vec![
                            text(e, "id"),
                            text(e, "name"),
                            text(e, "offering"),
                            text(e, "size"),
                            text(e, "state"),
                            when(e, "starts_at"),
                            when(e, "ends_at"),
                        ]
                    })
                    .collect();
                table(&["ID", "NAME", "OFFERING", "SIZE", "STATE", "STARTS", "ENDS"], &rows)
            });
            Ok(())
        }
        Command::Show { id } => {
            let env = api.get(&format!("/api/v1/environments/{id}"))?;
            print(out, &env, || environment_fields(&env));
            Ok(())
        }
        Command::Stop { id } => {
            let env = api.post(&format!("/api/v1/environments/{id}/stop"), &json!({}))?;
            print(out, &env, || {
                format!("Stopping {} ({}): {}\n", text(&env, "name"), text(&env, "id"), text(&env, "state"))
            });
            Ok(())
        }
        Command::Extend { id, hours, to } => {
            let ends_at = match (to, hours) {
                (Some(to), _) => to,
                (None, hours) => {
                    let env = api.get(&format!("/api/v1/environments/{id}"))?;
                    let end = chrono::DateTime::parse_from_rfc3339(&text(&env, "ends_at")).map_err(|_| {
                        Failure::Server(format!("the environment's end is not a time: {}", env["ends_at"]))
                    })?;
                    let later = end + chrono::TimeDelta::hours(i64::from(hours.unwrap_or(1)));
                    later.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                }
            };
            let env = api.post(&format!("/api/v1/environments/{id}/end"), &json!({ "ends_at": ends_at }))?;
            print(out, &env, || {
                format!("{} ({}) now ends {}\n", text(&env, "name"), text(&env, "id"), when(&env, "ends_at"))
            });
            Ok(())
        }
        Command::Logs { id, tail, follow } => logs(&api, out, &id, tail, follow),
        Command::Idle { id } => {
            let idle = api.get(&format!("/api/v1/environments/{id}/idle"))?;
            print(out, &idle, || idle_fields(&idle));
            Ok(())
        }
        Command::Keep { id } => {
            let idle = api.post(&format!("/api/v1/environments/{id}/keep"), &json!({}))?;
            print(out, &idle, || format!("Kept {id}: its idle clock starts again\n{}", idle_fields(&idle)));
            Ok(())
        }
        Command::Ssh { id, print: only_print, args } => {
            let env = api.get(&format!("/api/v1/environments/{id}"))?;
            let mut command = ssh_command(&env)?;
            command.extend(args);
            if only_print {
                println!("{}", command.join(" "));
                return Ok(());
            }
            let status = std::process::Command::new(&command[0])
                .args(&command[1..])
                .status()
                .map_err(|e| Failure::Local(format!("cannot run ssh: {e}")))?;
            match status.code() {
                Some(0) => Ok(()),
                code => Err(Failure::Local(format!(
                    "ssh ended with {}",
                    code.map_or("a signal".into(), |c| format!("status {c}"))
                ))),
            }
        }
        Command::Open { id, browser } => {
            let env = api.get(&format!("/api/v1/environments/{id}"))?;
            let url = text(&env, "url");
            if url.is_empty() {
                return Err(Failure::Usage(format!(
                    "{} is a {}: only notebooks and endpoints have a URL to open",
                    text(&env, "name"),
                    text(&env, "offering")
                )));
            }
            print(out, &json!({ "url": url }), || format!("{url}\n"));
            if browser {
                // Through the portal: it signs the browser in on the environment's origin.
                open_in_browser(&format!("{}/environments/{id}/open", api.base()))?;
            }
            Ok(())
        }
        Command::Keys { command } => match command.unwrap_or(Keys::List) {
            Keys::List => {
                let keys = api.get("/api/v1/ssh-keys")?;
                print(out, &keys, || {
                    let rows: Vec<Vec<String>> = items(&keys, "ssh_keys")
                        .into_iter()
                        .map(|k| {
                            vec![
                                text(k, "id"),
                                text(k, "name"),
                                text(k, "algorithm"),
                                text(k, "fingerprint"),
                                when(k, "created_at"),
                            ]
                        })
                        .collect();
                    table(&["ID", "NAME", "TYPE", "FINGERPRINT", "ADDED"], &rows)
                });
                Ok(())
            }
            Keys::Add { .. } => Err(Failure::Forbidden(format!(
                "an SSH key opens a shell on nodes, so Berth takes one only from a signed-in person, \
                 never from an API token; add it on {}/account",
                api.base()
            ))),
            Keys::Remove { id } => {
                let removed = api.delete(&format!("/api/v1/ssh-keys/{id}"))?;
                print(out, &removed, || format!("Removed SSH key {id}\n"));
                Ok(())
            }
        },
    }
}

/// The portal and token: flags and `BERTH_URL`/`BERTH_TOKEN` first, then the saved config.
fn connect(cli: &Cli) -> Result<Api, Failure> {
    let saved = config::load()?.unwrap_or_default();
    let url = cli.url.clone().filter(|u| !u.is_empty()).unwrap_or(saved.url);
    let token = cli.token.clone().filter(|t| !t.is_empty()).unwrap_or(saved.token);
    if url.is_empty() || token.is_empty() {
        return Err(Failure::Unauthenticated(
            "run `berthctl login --url https://<your Berth>` first (or set BERTH_URL and BERTH_TOKEN)".into(),
        ));
    }
    Api::new(&url, &token)
}

fn login(cli: &Cli, with_token: Option<String>, browser: bool) -> Result<(), Failure> {
    let saved = config::load()?.unwrap_or_default();
    let url = cli.url.clone().filter(|u| !u.is_empty()).unwrap_or(saved.url);
    if url.is_empty() {
        return Err(Failure::Usage("which Berth? give --url https://<your Berth> (or BERTH_URL)".into()));
    }
    let url = url.trim_end_matches('/').to_owned();
    let token = match with_token.or_else(|| cli.token.clone()).filter(|t| !t.is_empty()) {
        Some(token) => token,
        None => {
            if browser {
                open_in_browser(&format!("{url}/account"))?;
            }
            eprint!("Make a token on {url}/account and paste it here: ");
            let _ = std::io::stderr().flush();
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut line)
                .map_err(|e| Failure::Local(format!("cannot read the token: {e}")))?;
            line.trim().to_owned()
        }
    };
    if token.is_empty() {
        return Err(Failure::Usage("no token given".into()));
    }
    let me = Api::new(&url, &token)?.get("/api/v1/me")?;
    let path = config::save(&config::Config { url: url.clone(), token })?;
    print(cli.output, &me, || {
        format!(
            "Signed in to {url} as user {} ({}); saved in {}\n",
            text(&me, "user_id"),
            text(&me, "role"),
            path.display()
        )
    });
    Ok(())
}

/// A list field's items.
fn items<'a>(value: &'a Value, field: &str) -> Vec<&'a Value> {
    value[field].as_array().map(|a| a.iter().collect()).unwrap_or_default()
}

fn environment_fields(env: &Value) -> String {
    let connection = &env["connection"];
    fields(&[
        ("id", text(env, "id")),
        ("name", text(env, "name")),
        ("offering", text(env, "offering")),
        ("size", text(env, "size")),
        ("state", text(env, "state")),
        ("tier", text(env, "tier")),
        ("starts", when(env, "starts_at")),
        ("ends", when(env, "ends_at")),
        ("failure", text(env, "failure_reason")),
        ("url", text(env, "url")),
        ("connect", text(connection, "url")),
        ("example", text(connection, "example")),
    ])
}

/// The ssh command of a dedicated cluster's connection: the first `ssh …` of its example
/// (bare metal lists one per node), else its `ssh://` URL.
fn ssh_command(env: &Value) -> Result<Vec<String>, Failure> {
    let connection = &env["connection"];
    let example = text(connection, "example");
    if let Some(first) = example.split(" / ").map(str::trim).find(|c| c.starts_with("ssh ")) {
        return Ok(first.split_whitespace().map(str::to_owned).collect());
    }
    if let Some(target) = text(connection, "url").strip_prefix("ssh://") {
        let target = target.trim_end_matches('/');
        return Ok(match target.rsplit_once(':') {
            Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => {
                vec!["ssh".into(), "-p".into(), port.into(), host.into()]
            }
            _ => vec!["ssh".into(), target.into()],
        });
    }
    let why = if text(env, "offering") == "cluster" {
        "its connection details are not there yet (is it ready?)"
    } else {
        "only dedicated clusters are reached over SSH"
    };
    Err(Failure::Usage(format!("no SSH for {}: {why}", text(env, "name"))))
}

/// Prints the job's log; with `follow`, polls and prints what is new until the job ends.
fn logs(api: &Api, out: Output, id: &str, tail: u32, follow: bool) -> Result<(), Failure> {
    let path = format!("/api/v1/environments/{id}/logs");
    let mut seen: Vec<String> = Vec::new();
    let mut waiting = false;
    loop {
        let answer = match api.get_query(&path, &[("tail", tail.to_string())]) {
            Ok(answer) => answer,
            // Followed from its booking: the job has no log until it runs.
            Err(Failure::Refused(why)) if follow => {
                let env = api.get(&format!("/api/v1/environments/{id}"))?;
                let state = text(&env, "state");
                if state != "requested" && state != "provisioning" {
                    return Err(Failure::Refused(why));
                }
                if !waiting {
                    eprintln!("waiting for {} to start ({state})", text(&env, "name"));
                    waiting = true;
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
                continue;
            }
            Err(failure) => return Err(failure),
        };
        let lines: Vec<String> =
            items(&answer, "lines").into_iter().map(|l| l.as_str().unwrap_or_default().to_owned()).collect();
        let status = text(&answer, "status");
        if !follow {
            print(out, &answer, || {
                let mut text = lines.join("\n");
                if !text.is_empty() {
                    text.push('\n');
                }
                text
            });
            eprintln!("{}", status_line(&answer));
            return Ok(());
        }
        let new = &lines[overlap(&seen, &lines)..];
        for line in new {
            match out {
                Output::Json => println!("{}", json!({ "line": line })),
                Output::Table => println!("{line}"),
            }
        }
        let _ = std::io::stdout().flush();
        seen = lines;
        if status == "succeeded" || status == "failed" {
            eprintln!("{}", status_line(&answer));
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
}

fn status_line(answer: &Value) -> String {
    match text(answer, "status").as_str() {
        "failed" => format!("job failed: {} (exit code {})", text(answer, "reason"), text(answer, "exit_code")),
        status => format!("job {status}"),
    }
}

/// How many of `now`'s first lines `before` already printed: the longest end of `before`
/// that `now` starts with (the log's tail moves on as lines are added).
fn overlap(before: &[String], now: &[String]) -> usize {
    (0..=before.len().min(now.len())).rev().find(|&n| before[before.len() - n..] == now[..n]).unwrap_or(0)
}

fn open_in_browser(url: &str) -> Result<(), Failure> {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else if cfg!(windows) {
        "explorer"
    } else {
        "xdg-open"
    };
    std::process::Command::new(opener)
        .arg(url)
        .status()
        .map_err(|e| Failure::Local(format!("cannot open a browser ({opener}: {e}); open {url} yourself")))
        .map(|_| ())
}

/// An environment's standing with the idle watcher as `key value` lines.
fn idle_fields(idle: &Value) -> String {
    let policy = Some(text(idle, "policy")).filter(|p| !p.is_empty()).unwrap_or_else(|| "none applies".into());
    let keeps_left = match &idle["keeps_left"] {
        _ if idle["policy"].is_null() => String::new(),
        Value::Null => "no limit".to_owned(),
        left => left.to_string(),
    };
    let may_keep = if idle["may_keep"] == true { "yes" } else { "no" };
    fields(&[
        ("policy", policy),
        ("idle since", when(idle, "idle_since")),
        ("stops at", when(idle, "stops_at")),
        ("stopped at", when(idle, "stopped_at")),
        ("keeps used", text(idle, "keeps_used")),
        ("keeps left", keeps_left),
        ("may keep now", may_keep.to_owned()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn a_followed_log_prints_each_line_once_as_its_tail_moves_on() {
        assert_eq!(overlap(&[], &lines("a b")), 0);
        assert_eq!(overlap(&lines("a b c"), &lines("b c d e")), 2);
        assert_eq!(overlap(&lines("a b"), &lines("a b")), 2);
        assert_eq!(overlap(&lines("a b"), &lines("x y")), 0);
    }

    #[test]
    fn ssh_comes_from_the_connection_details() {
        let connection = json!({"url": "ssh://berth-x@n1", "example": "ssh berth-x@n1 / ssh berth-x@n2"});
        let bare = json!({"offering": "cluster", "connection": connection});
        assert_eq!(ssh_command(&bare).ok(), Some(vec!["ssh".to_owned(), "berth-x@n1".to_owned()]));
        let port = json!({"offering": "cluster", "connection": {"url": "ssh://u@h:2222", "example": ""}});
        assert_eq!(ssh_command(&port).ok().map(|c| c.join(" ")), Some("ssh -p 2222 u@h".to_owned()));
        let notebook = json!({"offering": "notebook", "name": "nb", "connection": null});
        assert!(ssh_command(&notebook).is_err_and(|e| e.to_string().contains("only dedicated clusters")));
    }
}
