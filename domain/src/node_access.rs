//! SSH access to a bare-metal dedicated cluster: on each of its nodes, a local account for
//! the environment (`berth-<first 8 hex digits of its id>`) whose `authorized_keys` holds
//! the SSH keys of the people who may act in the environment (its owner and their tenant
//! admins, as `environment.connect` says), made when the cluster is handed over and
//! removed, home and all, when it goes.
//!
//! As with [`crate::host_network`], everything here is data: the agent reports what it
//! found ([`ObservedAccess`]), [`changes`] lists the smallest set of [`AccessChange`]s that
//! brings the node to the plan, and each change knows its commands. Berth touches only
//! accounts that carry both its name pattern and its mark in the GECOS field, so an
//! operator's own `berth-…` account is never changed or removed.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::agent::Command;
use crate::ssh_key::SshPublicKey;

/// Every account Berth makes is named with this prefix and 8 lower-case hex digits.
pub const ACCOUNT_PREFIX: &str = "berth-";
/// The GECOS field of Berth's accounts starts with this, then the environment's id.
pub const ACCOUNT_MARK: &str = "Berth environment ";
/// Where Berth puts an account's home (given to `useradd`, so the keys' place is known).
pub const HOME_ROOT: &str = "/home";
/// The login shell of Berth's accounts.
pub const SHELL: &str = "/bin/bash";

/// One environment's local account on a node, as the portal plans it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAccount {
    /// [`account_name`] of the environment.
    pub name: String,
    pub environment_id: String,
    /// `authorized_keys` lines (see [`SshPublicKey::authorized_line`]), in order.
    pub authorized_keys: Vec<String>,
}

/// `berth-` and the first 8 hex digits of the environment's id (a UUID): short enough for
/// every `useradd` (32 characters at most) and to type after `ssh`.
pub fn account_name(environment_id: &str) -> String {
    let short: String =
        environment_id.chars().filter(char::is_ascii_hexdigit).take(8).map(|c| c.to_ascii_lowercase()).collect();
    format!("{ACCOUNT_PREFIX}{short}")
}

/// Whether `name` has the form of Berth's accounts.
pub fn is_berth_account(name: &str) -> bool {
    name.strip_prefix(ACCOUNT_PREFIX)
        .is_some_and(|n| n.len() == 8 && n.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// The account's `authorized_keys` file: a line that says who keeps it, then the keys.
pub fn authorized_keys_file(account: &NodeAccount) -> String {
    let mut text = format!(
        "# Kept by Berth for environment {}: changes here are undone at the agent's next pass.\n",
        account.environment_id
    );
    for line in &account.authorized_keys {
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// Refuses accounts a node must not get: a malformed name, an id that does not give the
/// name, a key line that is no key, or one account twice.
pub fn validate(accounts: &[NodeAccount]) -> Result<(), Refusal> {
    let mut names = BTreeSet::new();
    for account in accounts {
        if !is_berth_account(&account.name) || account_name(&account.environment_id) != account.name {
            return Err(Refusal::InvalidNodeAccess(format!(
                "\"{}\" is not the account of environment {}",
                account.name, account.environment_id
            )));
        }
        if !names.insert(account.name.as_str()) {
            return Err(Refusal::InvalidNodeAccess(format!("account {} is planned twice", account.name)));
        }
        for line in &account.authorized_keys {
            let key = SshPublicKey::parse(line)
                .map_err(|e| Refusal::InvalidNodeAccess(format!("a key of {}: {e}", account.name)))?;
            if key.authorized_line(&key.comment) != *line {
                return Err(Refusal::InvalidNodeAccess(format!(
                    "a key line of {} is not as Berth writes it",
                    account.name
                )));
            }
        }
    }
    Ok(())
}

/// A local account as the agent found it (`getent passwd`, `getent group`, the file).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ObservedAccount {
    pub name: String,
    /// The GECOS field: Berth's accounts carry [`ACCOUNT_MARK`] and their environment.
    pub comment: String,
    pub home: String,
    /// Supplementary groups the account is a member of.
    pub groups: BTreeSet<String>,
    /// The `authorized_keys` file, `None` when it could not be read (missing).
    pub authorized_keys: Option<String>,
}

impl ObservedAccount {
    /// Berth made it: its name and its mark.
    pub fn is_berths(&self) -> bool {
        is_berth_account(&self.name) && self.comment.starts_with(ACCOUNT_MARK)
    }
}

/// The node's accounts of Berth's name pattern, and which groups exist on it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ObservedAccess {
    pub accounts: Vec<ObservedAccount>,
    pub groups: BTreeSet<String>,
}

impl ObservedAccess {
    /// The node once `changes` are made (what the properties and the agent's tests run
    /// against).
    pub fn after(&self, changes: &[AccessChange]) -> ObservedAccess {
        let mut state = self.clone();
        for change in changes {
            match change {
                AccessChange::DeleteAccount { name } => state.accounts.retain(|a| &a.name != name),
                AccessChange::AddAccount { name, environment_id, groups } => state.accounts.push(ObservedAccount {
                    name: name.clone(),
                    comment: format!("{ACCOUNT_MARK}{environment_id}"),
                    home: home_of(name),
                    groups: groups.iter().cloned().collect(),
                    authorized_keys: None,
                }),
                AccessChange::SetGroups { name, groups } => {
                    for a in state.accounts.iter_mut().filter(|a| &a.name == name) {
                        a.groups = groups.iter().cloned().collect();
                    }
                }
                AccessChange::WriteKeys { name, content, .. } => {
                    for a in state.accounts.iter_mut().filter(|a| &a.name == name) {
                        a.authorized_keys = Some(content.clone());
                    }
                }
            }
        }
        state
    }
}

fn home_of(name: &str) -> String {
    format!("{HOME_ROOT}/{name}")
}

/// One step from the node's accounts towards the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessChange {
    /// Ends the account's processes, then removes it with its home.
    DeleteAccount { name: String },
    /// Makes the account (its own group, a home under [`HOME_ROOT`], Berth's mark).
    AddAccount { name: String, environment_id: String, groups: Vec<String> },
    /// Sets the account's supplementary groups to exactly these.
    SetGroups { name: String, groups: Vec<String> },
    /// Replaces `~/.ssh/authorized_keys` (0600, in a 0700 `.ssh`), written as the account
    /// itself so a link the account holder planted there leads nowhere they could not
    /// already write.
    WriteKeys { name: String, home: String, content: String },
}

impl AccessChange {
    pub fn commands(&self) -> Vec<Command> {
        match self {
            AccessChange::DeleteAccount { name } => vec![
                // pkill answers 1 when the account runs nothing: not a failure here.
                Command::new("sh", &["-c", "pkill -KILL -u \"$1\"; [ $? -le 1 ]", "sh", name]),
                Command::new("userdel", &["--remove", name]),
            ],
            AccessChange::AddAccount { name, environment_id, groups } => {
                let home = home_of(name);
                let comment = format!("{ACCOUNT_MARK}{environment_id}");
                let mut args =
                    vec!["--create-home", "--home-dir", &home, "--shell", SHELL, "--user-group", "--comment", &comment];
                let joined = groups.join(",");
                if !groups.is_empty() {
                    args.extend(["--groups", &joined]);
                }
                args.push(name);
                vec![Command::new("useradd", &args)]
            }
            AccessChange::SetGroups { name, groups } => {
                vec![Command::new("usermod", &["--groups", &groups.join(","), name])]
            }
            AccessChange::WriteKeys { name, home, content } => vec![Command {
                program: "runuser",
                args: ["-u", name, "--", "sh", "-c", WRITE_KEYS, "sh", home].map(str::to_owned).to_vec(),
                stdin: Some(content.clone()),
            }],
        }
    }
}

/// Writes standard input to `$1/.ssh/authorized_keys` through a temporary file, so sshd
/// never reads half a file.
const WRITE_KEYS: &str = "umask 077 && mkdir -p \"$1/.ssh\" && cat > \"$1/.ssh/authorized_keys.berth\" \
                          && mv -f \"$1/.ssh/authorized_keys.berth\" \"$1/.ssh/authorized_keys\"";

/// The command that reads an account's `authorized_keys`, as the account.
pub fn read_keys_command(account: &ObservedAccount) -> Command {
    let path = format!("{}/.ssh/authorized_keys", account.home);
    Command::new("runuser", &["-u", &account.name, "--", "cat", &path])
}

/// The changes that bring `observed` to `planned`, in order: accounts that go first, then
/// new accounts, then groups, then keys. Each account joins `gpu_groups` that exist on
/// the node. Empty when the node matches.
///
/// Refused: a planned account whose name is taken by an account Berth did not make.
pub fn changes(
    observed: &ObservedAccess,
    planned: &[NodeAccount],
    gpu_groups: &[String],
) -> Result<Vec<AccessChange>, Refusal> {
    let groups: Vec<String> = gpu_groups
        .iter()
        .filter(|g| observed.groups.contains(*g))
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let wanted: BTreeMap<&str, &NodeAccount> = planned.iter().map(|a| (a.name.as_str(), a)).collect();
    let mut result = Vec::new();
    for account in observed.accounts.iter().filter(|a| a.is_berths()) {
        let stays = wanted
            .get(account.name.as_str())
            .is_some_and(|w| account.comment == format!("{ACCOUNT_MARK}{}", w.environment_id));
        if !stays {
            result.push(AccessChange::DeleteAccount { name: account.name.clone() });
        }
    }
    let after_deletes = observed.after(&result);
    for want in planned {
        let content = authorized_keys_file(want);
        match after_deletes.accounts.iter().find(|a| a.name == want.name) {
            Some(found) if !found.is_berths() => {
                return Err(Refusal::InvalidNodeAccess(format!(
                    "the node has an account {} that Berth did not make; rename or remove it",
                    want.name
                )));
            }
            Some(found) => {
                let have: Vec<String> = found.groups.iter().filter(|g| observed.groups.contains(*g)).cloned().collect();
                if have != groups {
                    result.push(AccessChange::SetGroups { name: want.name.clone(), groups: groups.clone() });
                }
                if found.authorized_keys.as_deref() != Some(content.as_str()) {
                    result.push(AccessChange::WriteKeys { name: want.name.clone(), home: found.home.clone(), content });
                }
            }
            None => {
                result.push(AccessChange::AddAccount {
                    name: want.name.clone(),
                    environment_id: want.environment_id.clone(),
                    groups: groups.clone(),
                });
                result.push(AccessChange::WriteKeys { name: want.name.clone(), home: home_of(&want.name), content });
            }
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKzNtyR4cmJGDog7LEjOcX9o3mjUze+WPw53Rf+R08s7 ada@laptop";
    const ENV: &str = "3f0c2a1e-5b7d-4c1e-9a2b-0123456789ab";

    fn account(keys: &[&str]) -> NodeAccount {
        NodeAccount {
            name: account_name(ENV),
            environment_id: ENV.into(),
            authorized_keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        }
    }

    fn node() -> ObservedAccess {
        ObservedAccess { accounts: Vec::new(), groups: ["video", "render", "users"].map(str::to_owned).into() }
    }

    fn gpu_groups() -> Vec<String> {
        vec!["video".into(), "render".into(), "nvidia".into()]
    }

    fn commands(changes: &[AccessChange]) -> Vec<String> {
        changes.iter().flat_map(AccessChange::commands).map(|c| c.to_string()).collect()
    }

    #[test]
    fn names_are_berth_and_eight_hex_digits() {
        assert_eq!(account_name(ENV), "berth-3f0c2a1e");
        assert!(is_berth_account("berth-3f0c2a1e"));
        for name in ["berth-3f0c2a1", "berth-3F0C2A1E", "berth-3f0c2a1ez", "root", "berth-", "xberth-3f0c2a1e"] {
            assert!(!is_berth_account(name), "{name}");
        }
    }

    #[test]
    fn a_new_account_is_made_in_the_gpu_groups_the_node_has_with_its_keys() {
        let changes = changes(&node(), &[account(&[KEY])], &gpu_groups()).expect("changes");
        assert_eq!(
            commands(&changes),
            [
                "useradd --create-home --home-dir /home/berth-3f0c2a1e --shell /bin/bash --user-group \
                 --comment Berth environment 3f0c2a1e-5b7d-4c1e-9a2b-0123456789ab --groups render,video berth-3f0c2a1e",
                format!("runuser -u berth-3f0c2a1e -- sh -c {WRITE_KEYS} sh /home/berth-3f0c2a1e").as_str(),
            ]
        );
        let AccessChange::WriteKeys { content, .. } = &changes[1] else { panic!("{changes:?}") };
        assert!(content.starts_with("# Kept by Berth for environment 3f0c2a1e-"));
        assert!(content.ends_with(&format!("\n{KEY}\n")));
        // Applied, a second pass finds nothing to do.
        let after = node().after(&changes);
        assert_eq!(super::changes(&after, &[account(&[KEY])], &gpu_groups()), Ok(Vec::new()));
    }

    #[test]
    fn keys_and_groups_that_drifted_are_put_back_and_accounts_that_went_are_removed() {
        let planned = [account(&[KEY])];
        let mut state = node().after(&changes(&node(), &planned, &gpu_groups()).expect("changes"));
        // The holder edited the file and left a group; an account of an ended environment
        // and one an operator made by hand are on the node too.
        state.accounts[0].authorized_keys = Some("ssh-ed25519 AAAA... intruder\n".into());
        state.accounts[0].groups.remove("video");
        state.accounts.push(ObservedAccount {
            name: "berth-00000001".into(),
            comment: format!("{ACCOUNT_MARK}00000001-0000-4000-8000-000000000000"),
            home: "/home/berth-00000001".into(),
            ..ObservedAccount::default()
        });
        state.accounts.push(ObservedAccount {
            name: "berth-00000002".into(),
            comment: "Operator's own".into(),
            ..ObservedAccount::default()
        });
        let changes = changes(&state, &planned, &gpu_groups()).expect("changes");
        assert_eq!(
            commands(&changes),
            [
                "sh -c pkill -KILL -u \"$1\"; [ $? -le 1 ] sh berth-00000001",
                "userdel --remove berth-00000001",
                "usermod --groups render,video berth-3f0c2a1e",
                format!("runuser -u berth-3f0c2a1e -- sh -c {WRITE_KEYS} sh /home/berth-3f0c2a1e").as_str(),
            ]
        );
        let after = state.after(&changes);
        assert_eq!(super::changes(&after, &planned, &gpu_groups()), Ok(Vec::new()));
        // The end of the window: Berth's account goes, the operator's stays.
        let gone = super::changes(&after, &[], &gpu_groups()).expect("changes");
        assert_eq!(gone, [AccessChange::DeleteAccount { name: "berth-3f0c2a1e".into() }]);
    }

    #[test]
    fn a_name_taken_by_someone_else_is_refused_and_bad_plans_never_reach_a_node() {
        let mut state = node();
        state.accounts.push(ObservedAccount {
            name: account_name(ENV),
            comment: "Bob".into(),
            ..ObservedAccount::default()
        });
        let error = changes(&state, &[account(&[])], &gpu_groups()).expect_err("taken");
        assert_eq!(
            error.to_string(),
            "node access: the node has an account berth-3f0c2a1e that Berth did not make; rename or remove it"
        );
        assert!(validate(&[account(&[KEY])]).is_ok());
        assert!(validate(&[account(&[KEY]), account(&[])]).is_err(), "twice");
        assert!(validate(&[NodeAccount { name: "root".into(), ..account(&[]) }]).is_err());
        let injected = format!("{KEY}\ncommand=\"sh\" {KEY}");
        assert!(validate(&[account(&[&injected])]).is_err());
        assert!(validate(&[account(&[&format!("no-pty {KEY}")])]).is_err());
    }
}
