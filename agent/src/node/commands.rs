//! Running the agent's commands (`ip`, `bridge`, `nft`, `nvidia-smi`) on the node.
//!
//! Everything the agent changes on its node goes through [`CommandRunner`]: the real
//! [`SystemRunner`] starts the programs, unit tests bring [`Recording`] and read back what
//! would have run.

use std::io::{Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use berth_domain::agent::Command;

/// A command that could not run or did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandError {
    /// The command line, for the operator.
    pub command: String,
    pub failure: Failure,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The program is not on this node.
    NotInstalled { program: String },
    /// It ran and exited non-zero, or did not finish in time: what it said.
    Failed { message: String },
}

impl std::error::Error for CommandError {}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.failure {
            Failure::NotInstalled { program } => write!(f, "{program} is not installed on this node"),
            Failure::Failed { message } => write!(f, "`{}` failed: {message}", self.command),
        }
    }
}

/// Runs commands on the node, one at a time, to completion.
pub trait CommandRunner: Send + Sync {
    /// Runs `command`; its standard output, or why it failed.
    fn run(&self, command: &Command) -> Result<String, CommandError>;

    /// Runs a health check's `command` for at most `limit`: its standard output whatever
    /// its exit status (a check that finds a fault exits non-zero and says what in its
    /// output), or why it could not run or finish.
    fn run_check(&self, command: &Command, limit: Duration) -> Result<String, CommandError> {
        let _ = limit;
        self.run(command)
    }
}

/// The node's own programs, optionally inside a network namespace (`ip netns exec`),
/// which is how the network tests give each simulated host its own stack.
pub struct SystemRunner {
    namespace: Option<String>,
    timeout: Duration,
}

/// `ip` and `nft` finish in milliseconds; `nvidia-smi` on a sick GPU can take long, but a
/// command that has not finished in this long is not going to.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

impl SystemRunner {
    pub fn new() -> SystemRunner {
        SystemRunner { namespace: None, timeout: COMMAND_TIMEOUT }
    }

    /// Only the network namespace tests run commands elsewhere than on the node itself.
    #[cfg(test)]
    pub fn in_namespace(namespace: &str) -> SystemRunner {
        SystemRunner { namespace: Some(namespace.to_owned()), timeout: COMMAND_TIMEOUT }
    }
}

impl Default for SystemRunner {
    fn default() -> SystemRunner {
        SystemRunner::new()
    }
}

impl SystemRunner {
    /// Runs `command` for at most `limit`: its exit status, standard output and error.
    fn spawn(
        &self,
        command: &Command,
        limit: Duration,
    ) -> Result<(std::process::ExitStatus, String, String), CommandError> {
        let line = command.to_string();
        let failed = |message: String| CommandError { command: line.clone(), failure: Failure::Failed { message } };
        let mut process = match &self.namespace {
            Some(namespace) => {
                let mut p = std::process::Command::new("ip");
                p.args(["netns", "exec", namespace, command.program]);
                p
            }
            None => std::process::Command::new(command.program),
        };
        process
            .args(&command.args)
            .stdin(if command.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Numbers and messages as the parsers expect them, whatever the node's locale.
            .env("LC_ALL", "C");
        let mut child = match process.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CommandError {
                    command: line.clone(),
                    failure: Failure::NotInstalled { program: command.program.into() },
                });
            }
            Err(e) => return Err(failed(format!("cannot start it: {e}"))),
        };
        if let (Some(mut stdin), Some(text)) = (child.stdin.take(), command.stdin.clone()) {
            // Written from a thread: a program that answers before reading all of its input
            // would otherwise block both ends.
            std::thread::spawn(move || {
                let _ = stdin.write_all(text.as_bytes());
            });
        }
        let stdout = child.stdout.take().map(read_all);
        let stderr = child.stderr.take().map(read_all);
        let deadline = Instant::now() + limit;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(failed(format!("no answer in {} s", limit.as_secs())));
                }
                Err(e) => return Err(failed(format!("cannot wait for it: {e}"))),
            }
        };
        let stdout = stdout.and_then(|t| t.join().ok()).unwrap_or_default();
        let stderr = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
        // `ip netns exec` reports a missing program itself.
        if !status.success()
            && self.namespace.is_some()
            && stderr.contains("exec of \"")
            && stderr.contains("No such file or directory")
        {
            return Err(CommandError {
                command: line,
                failure: Failure::NotInstalled { program: command.program.into() },
            });
        }
        Ok((status, stdout, stderr))
    }
}

impl CommandRunner for SystemRunner {
    fn run(&self, command: &Command) -> Result<String, CommandError> {
        let (status, stdout, stderr) = self.spawn(command, self.timeout)?;
        if status.success() {
            return Ok(stdout);
        }
        let message = stderr.trim();
        let message = if message.is_empty() { format!("exit status {status}") } else { message.to_owned() };
        Err(CommandError {
            command: command.to_string(),
            failure: Failure::Failed { message: message.chars().take(500).collect() },
        })
    }

    fn run_check(&self, command: &Command, limit: Duration) -> Result<String, CommandError> {
        let (status, stdout, stderr) = self.spawn(command, limit)?;
        // Nothing on standard output and a failure: what it said on its error stream is all
        // there is to judge (`ibstat` without ports, `dmesg` without the right to read).
        if stdout.trim().is_empty() && !status.success() {
            let message = stderr.trim();
            let message = if message.is_empty() { format!("exit status {status}") } else { message.to_owned() };
            return Err(CommandError {
                command: command.to_string(),
                failure: Failure::Failed { message: message.chars().take(500).collect() },
            });
        }
        Ok(stdout)
    }
}

fn read_all(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = from.read_to_string(&mut text);
        text
    })
}

/// A node that records what it is told to run and answers from a script: for unit tests.
#[cfg(test)]
pub mod recording {
    use std::sync::Mutex;

    use super::*;

    /// Answers a command line with the answer of the longest prefix it starts with; every
    /// other command succeeds with no output.
    #[derive(Default)]
    pub struct Recording {
        answers: Mutex<Vec<(String, Result<String, CommandError>)>>,
        log: Mutex<Vec<String>>,
    }

    impl Recording {
        pub fn answer(&self, prefix: &str, output: &str) -> &Recording {
            self.answers.lock().expect("answers").push((prefix.to_owned(), Ok(output.to_owned())));
            self
        }

        pub fn fail(&self, prefix: &str, failure: Failure) -> &Recording {
            let error = CommandError { command: prefix.to_owned(), failure };
            self.answers.lock().expect("answers").push((prefix.to_owned(), Err(error)));
            self
        }

        /// Every command line run so far, and forgets them.
        pub fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.log.lock().expect("log"))
        }
    }

    impl CommandRunner for Recording {
        fn run(&self, command: &Command) -> Result<String, CommandError> {
            let line = command.to_string();
            self.log.lock().expect("log").push(line.clone());
            let answers = self.answers.lock().expect("answers");
            // The longest matching prefix wins, then the latest, so a test can change the
            // node's state.
            let answer = answers
                .iter()
                .enumerate()
                .filter(|(_, (prefix, _))| line.starts_with(prefix.as_str()))
                .max_by_key(|(i, (prefix, _))| (prefix.len(), *i))
                .map(|(_, answer)| answer);
            match answer {
                Some((_, Ok(output))) => Ok(output.clone()),
                Some((_, Err(error))) => Err(CommandError { command: line, failure: error.failure.clone() }),
                None => Ok(String::new()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_runner_returns_output_and_says_what_failed() {
        let runner = SystemRunner::new();
        let mut cat = Command::new("cat", &[]);
        cat.stdin = Some("table inet berth\n".into());
        assert_eq!(runner.run(&cat), Ok("table inet berth\n".into()));
        let missing = runner.run(&Command::new("berth-no-such-program", &["x"])).expect_err("missing");
        assert_eq!(missing.to_string(), "berth-no-such-program is not installed on this node");
        let failing = runner.run(&Command::new("ls", &["/berth/no/such/path"])).expect_err("fails");
        assert!(failing.to_string().starts_with("`ls /berth/no/such/path` failed: ls: cannot access"), "{failing}");
    }

    #[test]
    fn a_check_that_exits_non_zero_still_gives_its_output() {
        let runner = SystemRunner::new();
        let failing_check = Command::new("sh", &["-c", "echo '{\"status\": \"Fail\"}'; exit 226"]);
        assert_eq!(runner.run_check(&failing_check, Duration::from_secs(10)), Ok("{\"status\": \"Fail\"}\n".into()));
        let silent = Command::new("sh", &["-c", "echo 'cannot open /dev/kmsg' >&2; exit 1"]);
        let error = runner.run_check(&silent, Duration::from_secs(10)).expect_err("no output");
        assert_eq!(error.to_string(), "`sh -c echo 'cannot open /dev/kmsg' >&2; exit 1` failed: cannot open /dev/kmsg");
        let slow = runner.run_check(&Command::new("sleep", &["30"]), Duration::from_millis(200)).expect_err("stopped");
        assert_eq!(slow.to_string(), "`sleep 30` failed: no answer in 0 s");
    }

    #[test]
    fn a_command_that_hangs_is_stopped() {
        let runner = SystemRunner { namespace: None, timeout: Duration::from_millis(200) };
        let error = runner.run(&Command::new("sleep", &["30"])).expect_err("stopped");
        assert_eq!(error.to_string(), "`sleep 30` failed: no answer in 0 s");
    }
}
