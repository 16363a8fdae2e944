//! The agent's side of SSH access to dedicated clusters: reads Berth's local accounts,
//! their groups and `authorized_keys` from the node, and runs the changes
//! `berth_domain::node_access` plans, so applying the same plan again changes nothing.

use std::collections::BTreeSet;

use berth_domain::agent::Command;
use berth_domain::node_access::{self, AccessChange, NodeAccount, ObservedAccess, ObservedAccount};

use super::commands::{CommandRunner, Failure};
use crate::NodeError;

/// The groups a dedicated cluster's account joins when the node has them: those that own
/// the GPU device files where the driver does not leave them open to everyone
/// (`NVreg_DeviceFileGID`, usually `video`) and the DRM render nodes (`render`).
pub const DEFAULT_GPU_GROUPS: [&str; 2] = ["video", "render"];

/// Brings the node's accounts to `accounts`; the changes it made (none when the node
/// already matched). Stops at the first command that fails, saying which and why.
pub fn apply(
    runner: &dyn CommandRunner,
    gpu_groups: &[String],
    accounts: &[NodeAccount],
) -> Result<Vec<AccessChange>, NodeError> {
    let observed = observe(runner)?;
    let changes = node_access::changes(&observed, accounts, gpu_groups)?;
    for change in &changes {
        for command in change.commands() {
            runner.run(&command).map_err(|e| match e.failure {
                Failure::NotInstalled { program } => NodeError::NoAccountTool(program),
                Failure::Failed { .. } => NodeError::CommandFailed { doing: "set up SSH access".into(), source: e },
            })?;
        }
    }
    Ok(changes)
}

/// Berth's accounts on the node as they are now, with the groups the node has.
pub fn observe(runner: &dyn CommandRunner) -> Result<ObservedAccess, NodeError> {
    let read = |args: &[&str]| {
        runner
            .run(&Command::new("getent", args))
            .map_err(|source| NodeError::CommandFailed { doing: "read the node's accounts".into(), source })
    };
    let passwd = read(&["passwd"])?;
    let group = read(&["group"])?;
    let mut groups = BTreeSet::new();
    let mut members: Vec<(String, Vec<String>)> = Vec::new();
    for line in group.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        let Some(name) = fields.first().filter(|n| !n.is_empty()) else { continue };
        groups.insert((*name).to_owned());
        let listed = fields.get(3).map(|m| m.split(',').map(str::to_owned).collect()).unwrap_or_default();
        members.push(((*name).to_owned(), listed));
    }
    let mut accounts = Vec::new();
    for line in passwd.lines() {
        // name:password:uid:gid:gecos:home:shell
        let fields: Vec<&str> = line.split(':').collect();
        let (Some(name), Some(comment), Some(home)) = (fields.first(), fields.get(4), fields.get(5)) else {
            continue;
        };
        if !node_access::is_berth_account(name) {
            continue;
        }
        let mut account = ObservedAccount {
            name: (*name).to_owned(),
            comment: (*comment).to_owned(),
            home: (*home).to_owned(),
            groups: members.iter().filter(|(_, m)| m.iter().any(|m| m == name)).map(|(g, _)| g.clone()).collect(),
            authorized_keys: None,
        };
        if account.is_berths() {
            // Read as the account itself: a link its holder put there leads nowhere they
            // could not read anyway. A missing file reads as none, and is written.
            account.authorized_keys = runner.run(&node_access::read_keys_command(&account)).ok();
        }
        accounts.push(account);
    }
    Ok(ObservedAccess { accounts, groups })
}

#[cfg(test)]
mod tests {
    use berth_domain::node_access::{ACCOUNT_MARK, account_name, authorized_keys_file};

    use super::*;
    use crate::node::commands::recording::Recording;

    const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKzNtyR4cmJGDog7LEjOcX9o3mjUze+WPw53Rf+R08s7 ada@laptop";
    const ENV: &str = "3f0c2a1e-5b7d-4c1e-9a2b-0123456789ab";
    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nada:x:1000:1000:Ada,,,:/home/ada:/bin/bash\n";
    const GROUP: &str = "root:x:0:\nvideo:x:44:ada\nrender:x:109:\nada:x:1000:\n";

    fn cluster() -> NodeAccount {
        NodeAccount { name: account_name(ENV), environment_id: ENV.into(), authorized_keys: vec![KEY.into()] }
    }

    fn groups() -> Vec<String> {
        DEFAULT_GPU_GROUPS.map(str::to_owned).to_vec()
    }

    /// A node without Berth's account.
    fn bare_node() -> Recording {
        let node = Recording::default();
        node.answer("getent passwd", PASSWD).answer("getent group", GROUP);
        node
    }

    /// The same node once the cluster's account is on it, as `getent` and `cat` show it.
    fn node_with_account(keys: &str) -> Recording {
        let node = bare_node();
        node.answer(
            "getent passwd",
            &format!("{PASSWD}berth-3f0c2a1e:x:1001:1001:{ACCOUNT_MARK}{ENV}:/home/berth-3f0c2a1e:/bin/bash\n"),
        )
        .answer(
            "getent group",
            "root:x:0:\nvideo:x:44:ada,berth-3f0c2a1e\nrender:x:109:berth-3f0c2a1e\nada:x:1000:\nberth-3f0c2a1e:x:1001:\n",
        )
        .answer("runuser -u berth-3f0c2a1e -- cat /home/berth-3f0c2a1e/.ssh/authorized_keys", keys);
        node
    }

    #[test]
    fn the_account_is_made_with_its_keys_then_a_second_apply_only_reads() {
        let node = bare_node();
        apply(&node, &groups(), &[cluster()]).expect("applied");
        let ran = node.take();
        assert_eq!(ran[..2], ["getent passwd", "getent group"]);
        assert_eq!(
            ran[2],
            "useradd --create-home --home-dir /home/berth-3f0c2a1e --shell /bin/bash --user-group --comment \
             Berth environment 3f0c2a1e-5b7d-4c1e-9a2b-0123456789ab --groups render,video berth-3f0c2a1e"
        );
        assert!(ran[3].starts_with("runuser -u berth-3f0c2a1e -- sh -c umask 077 && mkdir -p"), "{}", ran[3]);
        assert!(ran[3].ends_with("sh /home/berth-3f0c2a1e"), "{}", ran[3]);
        assert_eq!(ran.len(), 4);

        // The node as it now is: a second pass reads, finds everything in place, runs
        // nothing that changes it.
        let node = node_with_account(&authorized_keys_file(&cluster()));
        assert_eq!(apply(&node, &groups(), &[cluster()]), Ok(Vec::new()));
        assert_eq!(
            node.take(),
            [
                "getent passwd",
                "getent group",
                "runuser -u berth-3f0c2a1e -- cat /home/berth-3f0c2a1e/.ssh/authorized_keys"
            ]
        );
    }

    #[test]
    fn keys_are_written_through_standard_input_as_the_account() {
        let node = node_with_account("# edited by hand\n");
        let changes = apply(&node, &groups(), &[cluster()]).expect("applied");
        let [AccessChange::WriteKeys { content, .. }] = &changes[..] else { panic!("{changes:?}") };
        let command = &changes[0].commands()[0];
        assert_eq!(
            (command.program, &command.args[..4]),
            ("runuser", &["-u", "berth-3f0c2a1e", "--", "sh"].map(str::to_owned)[..])
        );
        assert_eq!(command.stdin.as_ref(), Some(content));
        assert!(!command.to_string().contains("AAAAC3Nza"), "keys never go on the command line");
        assert!(content.ends_with(&format!("{KEY}\n")));
    }

    #[test]
    fn at_teardown_the_account_goes_with_its_processes_and_home() {
        let node = node_with_account(&authorized_keys_file(&cluster()));
        apply(&node, &groups(), &[]).expect("applied");
        assert_eq!(
            node.take()[3..],
            ["sh -c pkill -KILL -u \"$1\"; [ $? -le 1 ] sh berth-3f0c2a1e", "userdel --remove berth-3f0c2a1e"]
        );
        // Nothing of Berth's on the node: only read.
        let node = bare_node();
        assert_eq!(apply(&node, &groups(), &[]), Ok(Vec::new()));
        assert_eq!(node.take(), ["getent passwd", "getent group"]);
    }

    #[test]
    fn missing_tools_and_failures_are_named() {
        let node = bare_node();
        node.fail("useradd", Failure::NotInstalled { program: "useradd".into() });
        let error = apply(&node, &groups(), &[cluster()]).expect_err("no useradd").to_string();
        assert!(error.starts_with("useradd is not installed on this node; SSH access"), "{error}");
        let node = bare_node();
        node.fail("useradd", Failure::Failed { message: "useradd: group 'render' does not exist".into() });
        let error = apply(&node, &groups(), &[cluster()]).expect_err("failed").to_string();
        assert!(error.starts_with("cannot set up SSH access: `useradd --create-home"), "{error}");
    }
}
