//! Filesystem quotas for bare-metal volumes, where `--baremetal-volumes-path` is on a
//! filesystem that has them:
//! - **XFS** with project quotas enforced: each volume's directory is an XFS project whose hard
//!   block limit is the volume's size, so writes past it fail;
//! - **CephFS**: each volume's directory has a `ceph.quota.max_bytes` of its size, which CephFS
//!   clients enforce (they may write a little past it before they notice, as CephFS says).
//!
//! Detected once at start ([`VolumeQuotas::detect`]); the command lines and the reading of
//! their output are pure functions, run through a [`Runner`] that tests replace. Elsewhere
//! (NFS, Lustre, ext4) sizes are measured.
//!
//! A volume's project id is `PROJECT_ID_BASE + volume id` ([`project_id`]): deterministic,
//! so Berth keeps no table of them and a restart sets the same ids again, and above the
//! low ids sites hand out themselves in `/etc/projid`. A volume whose id would not fit
//! XFS's 32-bit project ids gets no quota (its size is then measured, as without XFS).

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// The first project id Berth uses: volume 1 is project 1,000,001.
pub const PROJECT_ID_BASE: u32 = 1_000_000;

/// A volume's XFS project id; `None` when it does not fit (32 bits, 0 is "no project").
pub fn project_id(volume_id: i64) -> Option<u32> {
    let id = i64::from(PROJECT_ID_BASE).checked_add(volume_id)?;
    u32::try_from(id).ok().filter(|id| *id > PROJECT_ID_BASE && *id < u32::MAX)
}

/// One command line: the program and its arguments, as they are passed (no shell).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandLine {
    pub program: &'static str,
    pub args: Vec<String>,
}

impl std::fmt::Display for CommandLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.program)?;
        for arg in &self.args {
            if arg.contains(' ') { write!(f, " '{arg}'")? } else { write!(f, " {arg}")? }
        }
        Ok(())
    }
}

/// The filesystem that holds `path` and where it is mounted: `findmnt` prints
/// `<fstype> <mount point>`, the mount point's spaces as `\x20`.
pub fn filesystem_command(path: &Path) -> CommandLine {
    let args = ["-n", "-r", "-o", "FSTYPE,TARGET", "-T"].map(str::to_owned);
    let mut args = args.to_vec();
    args.push(path.display().to_string());
    CommandLine { program: "findmnt", args }
}

/// `findmnt`'s answer: the filesystem's type and its mount point.
pub fn parse_filesystem(stdout: &str) -> Option<(String, PathBuf)> {
    let line = stdout.lines().find(|l| !l.trim().is_empty())?;
    let (fstype, target) = line.trim().split_once(' ')?;
    Some((fstype.to_owned(), PathBuf::from(unescape(target))))
}

/// `findmnt -r`'s escapes (`\x20` and the like) undone.
fn unescape(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && bytes.get(i + 1) == Some(&b'x')
            && let Some(byte) = text.get(i + 2..i + 4).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(byte);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `xfs_quota -x -c state <mount>`: which quotas the filesystem accounts and enforces.
pub fn state_command(mount: &Path) -> CommandLine {
    CommandLine {
        program: "xfs_quota",
        args: vec!["-x".into(), "-c".into(), "state".into(), mount.display().to_string()],
    }
}

/// `getfattr -n ceph.dir.rbytes --only-values <dir>`: a directory's recursive size, an
/// attribute every CephFS directory has: reading it says the filesystem is CephFS and that
/// `getfattr`/`setfattr` (Debian's `attr`) are installed.
pub fn ceph_probe_command(dir: &Path) -> CommandLine {
    CommandLine {
        program: "getfattr",
        args: vec!["-n".into(), "ceph.dir.rbytes".into(), "--only-values".into(), dir.display().to_string()],
    }
}

/// `setfattr -n ceph.quota.max_bytes -v <bytes> <dir>`: a CephFS directory's quota.
pub fn ceph_limit_command(dir: &Path, size_gib: u32) -> CommandLine {
    let bytes = u64::from(size_gib) << 30;
    CommandLine {
        program: "setfattr",
        args: vec![
            "-n".into(),
            "ceph.quota.max_bytes".into(),
            "-v".into(),
            bytes.to_string(),
            dir.display().to_string(),
        ],
    }
}

/// Whether `xfs_quota -x -c state` says project quotas are both accounted and enforced.
/// Its answer has a section per quota type (xfsprogs `quota/state.c`):
///
/// ```text
/// Project quota state on /srv/berth (/dev/sdb1)
///   Accounting: ON
///   Enforcement: ON
/// ```
///
/// `Err` says what is off, for the log.
pub fn project_quotas_on(stdout: &str) -> Result<(), String> {
    let mut section = false;
    let (mut accounting, mut enforcement) = (None, None);
    for line in stdout.lines() {
        if !line.starts_with(' ') {
            section = line.starts_with("Project quota state on ");
            continue;
        }
        if !section {
            continue;
        }
        let line = line.trim();
        if let Some(v) = line.strip_prefix("Accounting:") {
            accounting = Some(v.trim() == "ON");
        } else if let Some(v) = line.strip_prefix("Enforcement:") {
            enforcement = Some(v.trim() == "ON");
        }
    }
    match (accounting, enforcement) {
        (Some(true), Some(true)) => Ok(()),
        (None, _) | (_, None) => Err("xfs_quota reports no project quota state".into()),
        (Some(false), _) => Err("project quota accounting is off (mount with prjquota)".into()),
        (Some(true), Some(false)) => Err("project quotas are accounted but not enforced".into()),
    }
}

/// `xfs_quota -x -c 'project -s -p <dir> <id>' <mount>`: makes `dir` (and what it will hold)
/// project `id`. `None` for a directory xfs_quota's command line could not carry (it splits
/// on spaces and reads quotes).
pub fn project_command(mount: &Path, dir: &Path, id: u32) -> Option<CommandLine> {
    let dir = dir.to_str().filter(|d| !d.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"'))?;
    Some(CommandLine {
        program: "xfs_quota",
        args: vec!["-x".into(), "-c".into(), format!("project -s -p {dir} {id}"), mount.display().to_string()],
    })
}

/// `xfs_quota -x -c 'limit -p bhard=<bytes> <id>' <mount>`: project `id`'s hard block limit.
pub fn limit_command(mount: &Path, id: u32, size_gib: u32) -> CommandLine {
    let bytes = u64::from(size_gib) << 30;
    CommandLine {
        program: "xfs_quota",
        args: vec!["-x".into(), "-c".into(), format!("limit -p bhard={bytes} {id}"), mount.display().to_string()],
    }
}

/// What a command answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// xfs_quota reports many failures on standard error yet exits 0: a command worked when it
/// exited 0 and wrote no error. `Err` is what it said.
pub fn worked(output: &CommandOutput) -> Result<(), String> {
    let said = output.stderr.trim();
    if output.success && said.is_empty() {
        Ok(())
    } else if said.is_empty() {
        Err("it failed without saying why".into())
    } else {
        Err(said.lines().take(3).collect::<Vec<_>>().join(" / "))
    }
}

/// `project -s` worked when it also says it processed the directory for the project:
/// `Processed 1 (/etc/projects and cmdline) paths for project 1000007 with recursion depth
/// infinite (-1).`
pub fn project_set_up(output: &CommandOutput, id: u32) -> Result<(), String> {
    worked(output)?;
    let done = format!("paths for project {id} ");
    if output.stdout.lines().any(|l| l.starts_with("Processed ") && l.contains(&done)) {
        Ok(())
    } else {
        Err(format!("xfs_quota did not say it set up project {id}: {}", output.stdout.trim()))
    }
}

pub type RunFuture<'a> = Pin<Box<dyn Future<Output = std::io::Result<CommandOutput>> + Send + 'a>>;

/// Runs a command line; tests record them instead.
pub trait Runner: Send + Sync {
    fn run<'a>(&'a self, command: &'a CommandLine) -> RunFuture<'a>;
}

/// Runs commands on Berth's host.
pub struct SystemRunner;

impl Runner for SystemRunner {
    fn run<'a>(&'a self, command: &'a CommandLine) -> RunFuture<'a> {
        let command = command.clone();
        Box::pin(async move {
            let output = tokio::task::spawn_blocking(move || {
                std::process::Command::new(command.program).args(&command.args).output()
            })
            .await
            .map_err(std::io::Error::other)??;
            Ok(CommandOutput {
                success: output.status.success(),
                stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            })
        })
    }
}

/// Which quotas hold the volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaKind {
    XfsProject,
    CephDirectory,
}

/// Quotas on the filesystem that keeps the volumes, found on at start.
pub struct VolumeQuotas {
    runner: Arc<dyn Runner>,
    kind: QuotaKind,
    mount: PathBuf,
    /// What each volume's quota is now, as far as this process knows: set at a size, or
    /// failed at one (logged once; tried again when the size changes or Berth restarts).
    held: Mutex<HashMap<i64, Held>>,
    /// One quota change at a time: the start step and the reconciler's pass may both ask
    /// for the same volume at once, and the second must see what the first did.
    turn: tokio::sync::Mutex<()>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    At(u32),
    FailedAt(u32),
}

impl std::fmt::Debug for VolumeQuotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeQuotas").field("mount", &self.mount).finish_non_exhaustive()
    }
}

impl VolumeQuotas {
    /// Whether `volumes_path` is on XFS with project quotas enforced or on CephFS with the
    /// tools to set its quotas; `Err` says why not.
    pub async fn detect(volumes_path: &Path, runner: Arc<dyn Runner>) -> Result<VolumeQuotas, String> {
        let found = runner.run(&filesystem_command(volumes_path)).await;
        let found = found.map_err(|e| format!("cannot run findmnt: {e}"))?;
        worked(&found).map_err(|e| format!("findmnt cannot find the filesystem of {}: {e}", volumes_path.display()))?;
        let (fstype, mount) = parse_filesystem(&found.stdout)
            .ok_or_else(|| format!("findmnt's answer for {} is not understood", volumes_path.display()))?;
        // The kernel client mounts `ceph`, the FUSE one `fuse.ceph-fuse`.
        if fstype == "ceph" || fstype == "fuse.ceph-fuse" {
            let probe = runner.run(&ceph_probe_command(volumes_path)).await;
            let probe = probe.map_err(|e| format!("cannot run getfattr (install the attr package): {e}"))?;
            worked(&probe)
                .map_err(|e| format!("CephFS at {}: getfattr cannot read its attributes: {e}", mount.display()))?;
            let kind = QuotaKind::CephDirectory;
            return Ok(VolumeQuotas {
                runner,
                kind,
                mount,
                held: Mutex::new(HashMap::new()),
                turn: tokio::sync::Mutex::new(()),
            });
        }
        if fstype != "xfs" {
            return Err(format!("{} is on {fstype}, neither XFS nor CephFS", volumes_path.display()));
        }
        let state = runner.run(&state_command(&mount)).await.map_err(|e| format!("cannot run xfs_quota: {e}"))?;
        worked(&state).map_err(|e| format!("xfs_quota state on {}: {e}", mount.display()))?;
        project_quotas_on(&state.stdout).map_err(|e| format!("XFS at {}: {e}", mount.display()))?;
        Ok(VolumeQuotas {
            runner,
            kind: QuotaKind::XfsProject,
            mount,
            held: Mutex::new(HashMap::new()),
            turn: tokio::sync::Mutex::new(()),
        })
    }

    pub fn mount(&self) -> &Path {
        &self.mount
    }

    pub fn kind(&self) -> QuotaKind {
        self.kind
    }

    /// Makes volume `volume_id`'s directory `dir` its project and limits it to `size_gib`,
    /// unless that is done already. `Err` says why it could not be; the caller logs it and
    /// the volume is held by measuring it. A quota that failed at this size is not tried
    /// again (`Ok`, nothing run) until the size changes or Berth restarts.
    pub async fn hold(&self, volume_id: i64, dir: &Path, size_gib: u32) -> Result<(), String> {
        let _turn = self.turn.lock().await;
        let before = self.held.lock().map(|held| held.get(&volume_id).copied()).unwrap_or(None);
        match before {
            Some(Held::At(size)) | Some(Held::FailedAt(size)) if size == size_gib => return Ok(()),
            _ => {}
        }
        let made = matches!(before, Some(Held::At(_)));
        let outcome = self.set(volume_id, dir, size_gib, !made).await;
        let now = if outcome.is_ok() { Held::At(size_gib) } else { Held::FailedAt(size_gib) };
        if let Ok(mut held) = self.held.lock() {
            held.insert(volume_id, now);
        }
        outcome
    }

    /// `first`: the directory is not known to hold its quota yet.
    async fn set(&self, volume_id: i64, dir: &Path, size_gib: u32, first: bool) -> Result<(), String> {
        // The directory is made here, before any node writes into it, so that everything
        // in it counts (`project -s` sets XFS's inherit flag; a CephFS quota is on the
        // directory). Again after a restart: both are safe to repeat.
        if first {
            let made = dir.to_path_buf();
            tokio::task::spawn_blocking(move || std::fs::create_dir_all(&made))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        }
        if self.kind == QuotaKind::CephDirectory {
            let limit = ceph_limit_command(dir, size_gib);
            let output = self.runner.run(&limit).await.map_err(|e| format!("cannot run setfattr: {e}"))?;
            return worked(&output).map_err(|e| format!("{limit}: {e}"));
        }
        let id = project_id(volume_id).ok_or_else(|| format!("volume {volume_id} has no XFS project id"))?;
        if first {
            let project = project_command(&self.mount, dir, id)
                .ok_or_else(|| format!("{} cannot be named to xfs_quota", dir.display()))?;
            let output = self.runner.run(&project).await.map_err(|e| format!("cannot run xfs_quota: {e}"))?;
            project_set_up(&output, id).map_err(|e| format!("{project}: {e}"))?;
        }
        let limit = limit_command(&self.mount, id, size_gib);
        let output = self.runner.run(&limit).await.map_err(|e| format!("cannot run xfs_quota: {e}"))?;
        worked(&output).map_err(|e| format!("{limit}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The outputs below are reconstructed from xfsprogs' documented formats (`findmnt -r`,
    // xfs_quota's `state` from quota/state.c, `project -s` from quota/project.c), not
    // recorded on a machine.
    const STATE_ON: &str = "User quota state on /srv/berth (/dev/sdb1)
  Accounting: OFF
  Enforcement: OFF
  Inode: #131 (1 blocks, 1 extents)
Blocks grace time: [7 days]
Blocks max warnings: 5
Inodes grace time: [7 days]
Inodes max warnings: 5
Realtime Blocks grace time: [7 days]
Group quota state on /srv/berth (/dev/sdb1)
  Accounting: OFF
  Enforcement: OFF
  Inode: N/A
Blocks grace time: [7 days]
Blocks max warnings: 5
Inodes grace time: [7 days]
Inodes max warnings: 5
Realtime Blocks grace time: [7 days]
Project quota state on /srv/berth (/dev/sdb1)
  Accounting: ON
  Enforcement: ON
  Inode: #133 (2 blocks, 2 extents)
Blocks grace time: [7 days]
Blocks max warnings: 5
Inodes grace time: [7 days]
Inodes max warnings: 5
Realtime Blocks grace time: [7 days]
";
    const PROJECT_SET_UP: &str = "Setting up project 1000007 (path /srv/berth/berth-vol-7)...
Processed 1 (/etc/projects and cmdline) paths for project 1000007 with recursion depth infinite (-1).
";

    #[test]
    fn project_ids_follow_volume_ids_and_stay_in_range() {
        assert_eq!(project_id(7), Some(1_000_007));
        assert_eq!(project_id(0), None);
        assert_eq!(project_id(-3), None);
        assert_eq!(project_id(i64::from(u32::MAX)), None);
        assert_eq!(project_id(i64::from(u32::MAX - PROJECT_ID_BASE - 1)), Some(u32::MAX - 1));
    }

    #[test]
    fn command_lines_are_xfs_quotas() {
        let mount = Path::new("/srv/berth");
        assert_eq!(
            filesystem_command(Path::new("/srv/berth/volumes")).to_string(),
            "findmnt -n -r -o FSTYPE,TARGET -T /srv/berth/volumes"
        );
        assert_eq!(state_command(mount).to_string(), "xfs_quota -x -c state /srv/berth");
        let project =
            project_command(mount, Path::new("/srv/berth/volumes/berth-vol-7"), 1_000_007).expect("plain path");
        assert_eq!(project.args, ["-x", "-c", "project -s -p /srv/berth/volumes/berth-vol-7 1000007", "/srv/berth"]);
        assert_eq!(project_command(mount, Path::new("/srv/my volumes/berth-vol-7"), 1), None);
        let limit = limit_command(mount, 1_000_007, 50);
        assert_eq!(limit.args, ["-x", "-c", "limit -p bhard=53687091200 1000007", "/srv/berth"]);
    }

    #[test]
    fn findmnt_and_state_are_read() {
        assert_eq!(parse_filesystem("xfs /srv/berth\n"), Some(("xfs".into(), PathBuf::from("/srv/berth"))));
        assert_eq!(
            parse_filesystem("nfs4 /mnt/shared\\x20data\n"),
            Some(("nfs4".into(), PathBuf::from("/mnt/shared data")))
        );
        assert_eq!(parse_filesystem(""), None);
        assert_eq!(project_quotas_on(STATE_ON), Ok(()));
        let off = STATE_ON.replace("  Accounting: ON\n  Enforcement: ON", "  Accounting: OFF\n  Enforcement: OFF");
        assert!(project_quotas_on(&off).unwrap_err().contains("prjquota"));
        let unenforced =
            STATE_ON.replace("  Accounting: ON\n  Enforcement: ON", "  Accounting: ON\n  Enforcement: OFF");
        assert!(project_quotas_on(&unenforced).unwrap_err().contains("not enforced"));
        assert!(project_quotas_on("").is_err());
    }

    #[test]
    fn xfs_quota_errors_on_stderr_are_failures_even_with_status_zero() {
        let ok = CommandOutput { success: true, stdout: PROJECT_SET_UP.into(), stderr: String::new() };
        assert_eq!(project_set_up(&ok, 1_000_007), Ok(()));
        assert!(project_set_up(&ok, 1_000_008).is_err(), "another project's answer");
        let denied = CommandOutput {
            success: true,
            stdout: String::new(),
            stderr: "xfs_quota: cannot set limits: Operation not permitted\n".into(),
        };
        assert_eq!(worked(&denied), Err("xfs_quota: cannot set limits: Operation not permitted".into()));
        assert!(worked(&CommandOutput::default()).is_err());
    }

    /// Answers each command line from a table and records it.
    #[derive(Default)]
    pub(crate) struct Recording {
        pub answers: Vec<(String, CommandOutput)>,
        pub ran: Mutex<Vec<String>>,
    }

    impl Runner for Recording {
        fn run<'a>(&'a self, command: &'a CommandLine) -> RunFuture<'a> {
            let line = command.to_string();
            if let Ok(mut ran) = self.ran.lock() {
                ran.push(line.clone());
            }
            let answer =
                self.answers.iter().find(|(prefix, _)| line.starts_with(prefix.as_str())).map(|(_, a)| a.clone());
            Box::pin(async move { Ok(answer.unwrap_or_default()) })
        }
    }

    fn said(stdout: &str) -> CommandOutput {
        CommandOutput { success: true, stdout: stdout.into(), stderr: String::new() }
    }

    #[tokio::test]
    async fn detected_on_xfs_then_a_volume_is_made_a_project_and_limited_and_grown() {
        let root = std::env::temp_dir().join(format!("berth-xfs-{}", std::process::id()));
        let runner = Arc::new(Recording {
            answers: vec![
                ("findmnt ".into(), said(&format!("xfs {}\n", root.display()))),
                ("xfs_quota -x -c state ".into(), said(STATE_ON)),
                ("xfs_quota -x -c 'project -s".into(), said(PROJECT_SET_UP)),
                ("xfs_quota -x -c 'limit".into(), said("")),
            ],
            ..Recording::default()
        });
        let quotas = VolumeQuotas::detect(&root, runner.clone()).await.expect("XFS with project quotas");
        let dir = root.join("berth-vol-7");
        quotas.hold(7, &dir, 10).await.expect("held");
        assert!(dir.is_dir(), "Berth makes the directory before the project");
        quotas.hold(7, &dir, 10).await.expect("unchanged: nothing to run");
        quotas.hold(7, &dir, 20).await.expect("grown");
        let r = root.display();
        assert_eq!(
            *runner.ran.lock().expect("ran"),
            [
                format!("findmnt -n -r -o FSTYPE,TARGET -T {r}"),
                format!("xfs_quota -x -c state {r}"),
                format!("xfs_quota -x -c 'project -s -p {r}/berth-vol-7 1000007' {r}"),
                format!("xfs_quota -x -c 'limit -p bhard=10737418240 1000007' {r}"),
                format!("xfs_quota -x -c 'limit -p bhard=21474836480 1000007' {r}"),
            ]
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn on_cephfs_a_volume_gets_a_directory_quota_of_its_size_and_again_when_grown() {
        let root = std::env::temp_dir().join(format!("berth-ceph-{}", std::process::id()));
        let runner = Arc::new(Recording {
            answers: vec![
                ("findmnt ".into(), said(&format!("ceph {}\n", root.display()))),
                ("getfattr ".into(), said("0")),
                ("setfattr ".into(), said("")),
            ],
            ..Recording::default()
        });
        let quotas = VolumeQuotas::detect(&root, runner.clone()).await.expect("CephFS");
        assert_eq!(quotas.kind(), QuotaKind::CephDirectory);
        let dir = root.join("berth-vol-7");
        quotas.hold(7, &dir, 10).await.expect("held");
        assert!(dir.is_dir(), "Berth makes the directory before the quota");
        quotas.hold(7, &dir, 10).await.expect("unchanged: nothing to run");
        quotas.hold(7, &dir, 20).await.expect("grown");
        let r = root.display();
        assert_eq!(
            *runner.ran.lock().expect("ran"),
            [
                format!("findmnt -n -r -o FSTYPE,TARGET -T {r}"),
                format!("getfattr -n ceph.dir.rbytes --only-values {r}"),
                format!("setfattr -n ceph.quota.max_bytes -v 10737418240 {r}/berth-vol-7"),
                format!("setfattr -n ceph.quota.max_bytes -v 21474836480 {r}/berth-vol-7"),
            ]
        );
        let _ = std::fs::remove_dir_all(&root);

        // Without the attr tools (or a FUSE mount that hides the attributes) it says why.
        let missing = CommandOutput { success: false, stdout: String::new(), stderr: "getfattr: not found\n".into() };
        let bare = Arc::new(Recording {
            answers: vec![("findmnt ".into(), said("fuse.ceph-fuse /mnt/ceph\n")), ("getfattr ".into(), missing)],
            ..Recording::default()
        });
        let why = VolumeQuotas::detect(Path::new("/mnt/ceph/berth"), bare).await.unwrap_err();
        assert_eq!(why, "CephFS at /mnt/ceph: getfattr cannot read its attributes: getfattr: not found");
    }

    #[tokio::test]
    async fn not_xfs_or_quotas_off_says_why_and_a_failed_quota_is_not_retried_at_its_size() {
        let nfs = Arc::new(Recording {
            answers: vec![("findmnt ".into(), said("nfs4 /mnt/shared\n"))],
            ..Recording::default()
        });
        let why = VolumeQuotas::detect(Path::new("/mnt/shared/berth"), nfs).await.unwrap_err();
        assert_eq!(why, "/mnt/shared/berth is on nfs4, neither XFS nor CephFS");
        let off = STATE_ON.replace("  Accounting: ON\n  Enforcement: ON", "  Accounting: OFF\n  Enforcement: OFF");
        let noquota = Arc::new(Recording {
            answers: vec![("findmnt ".into(), said("xfs /srv\n")), ("xfs_quota".into(), said(&off))],
            ..Recording::default()
        });
        let why = VolumeQuotas::detect(Path::new("/srv/berth"), noquota).await.unwrap_err();
        assert!(why.contains("project quota accounting is off"), "{why}");

        let root = std::env::temp_dir().join(format!("berth-xfs-denied-{}", std::process::id()));
        let denied = CommandOutput {
            success: false,
            stdout: String::new(),
            stderr: "xfs_quota: cannot set limits: Operation not permitted\n".into(),
        };
        let runner = Arc::new(Recording {
            answers: vec![
                ("findmnt ".into(), said(&format!("xfs {}\n", root.display()))),
                ("xfs_quota -x -c state ".into(), said(STATE_ON)),
                ("xfs_quota -x -c 'project -s".into(), said(PROJECT_SET_UP)),
                ("xfs_quota -x -c 'limit".into(), denied),
            ],
            ..Recording::default()
        });
        let quotas = VolumeQuotas::detect(&root, runner.clone()).await.expect("detected");
        let why = quotas.hold(7, &root.join("berth-vol-7"), 5).await.unwrap_err();
        assert!(why.contains("Operation not permitted"), "{why}");
        let ran = runner.ran.lock().expect("ran").len();
        quotas.hold(7, &root.join("berth-vol-7"), 5).await.expect("failed at this size already: left to measuring");
        assert_eq!(runner.ran.lock().expect("ran").len(), ran, "not tried again at the same size");
        let _ = std::fs::remove_dir_all(&root);
    }
}
