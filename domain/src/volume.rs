//! Volumes: storage that outlives a booking. A volume is personal (its owner's) or shared
//! with a project; every person has one home volume, made on their first launch. Here are
//! the rules a volume must pass: its name, its size, where it is mounted, who may attach
//! it to which booking, and the storage quotas it counts against.

use serde::{Deserialize, Serialize};

use crate::Refusal;

/// Where a person's home volume is mounted: the notebook image's working directory.
pub const HOME_MOUNT: &str = "/home/jovyan/work";
/// Other volumes are mounted at `/data/<name>`.
pub const DATA_ROOT: &str = "/data";
/// The home volume's name; no volume of one's own may take it.
pub const HOME_NAME: &str = "home";
/// A home volume's size when the tenant has not set one.
pub const DEFAULT_HOME_GIB: u32 = 10;
/// The largest volume Berth makes, whatever the quota says (64 TiB).
pub const MAX_VOLUME_GIB: u32 = 65_536;
/// A volume's name is a DNS label (RFC 1123), so it can name a Kubernetes object too.
pub const MAX_NAME: usize = 63;

/// Whom a volume belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeScope {
    /// Its owner's alone; the home volume is one.
    Personal,
    /// Shared with everyone who books in the project.
    Project(i64),
}

/// What the attach rules need to know about a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFacts {
    pub name: String,
    /// `None` for platform staff's own volumes.
    pub tenant_id: Option<i64>,
    pub owner_id: i64,
    pub scope: VolumeScope,
    pub is_home: bool,
}

/// What the attach rules need to know about the booking a volume would be attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BookingFacts {
    pub tenant_id: Option<i64>,
    pub owner_id: i64,
    pub project_id: Option<i64>,
}

/// A name that is a DNS label: 1 to 63 lowercase letters, digits and hyphens, starting
/// with a letter and not ending with a hyphen. `home` is the home volume's.
pub fn validate_name(name: &str) -> Result<String, Refusal> {
    let name = name.trim();
    if name.is_empty() {
        return Err(Refusal::InvalidVolumeName(format!(
            "a volume needs a name: lowercase letters, digits and hyphens, at most {MAX_NAME}"
        )));
    }
    if name.len() > MAX_NAME {
        return Err(Refusal::InvalidVolumeName(format!("\"{name}\" is longer than {MAX_NAME} characters")));
    }
    if !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
        return Err(Refusal::InvalidVolumeName(format!(
            "\"{name}\" may hold only lowercase letters, digits and hyphens"
        )));
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(Refusal::InvalidVolumeName(format!("\"{name}\" must start with a letter")));
    }
    if name.ends_with('-') {
        return Err(Refusal::InvalidVolumeName(format!("\"{name}\" must not end with a hyphen")));
    }
    if name == HOME_NAME {
        return Err(Refusal::InvalidVolumeName(
            "\"home\" is your home volume's name, which Berth makes on your first launch; pick another".into(),
        ));
    }
    Ok(name.to_owned())
}

/// A size in whole GiB, more than 0 and at most [`MAX_VOLUME_GIB`].
pub fn parse_size(size: &str) -> Result<u32, Refusal> {
    let bad = || Refusal::InvalidVolumeSize(format!("a whole number of GiB between 1 and {MAX_VOLUME_GIB}"));
    let gib: u32 = size.trim().parse().map_err(|_| bad())?;
    if gib == 0 || gib > MAX_VOLUME_GIB {
        return Err(bad());
    }
    Ok(gib)
}

/// A resize only grows a volume: shrinking could cut off files already written.
pub fn check_resize(current_gib: u32, asked: &str) -> Result<u32, Refusal> {
    let gib = parse_size(asked)?;
    if gib <= current_gib {
        return Err(Refusal::InvalidVolumeSize(format!(
            "a volume only grows: it has {current_gib} GiB, ask for more than that"
        )));
    }
    Ok(gib)
}

/// A volume last measured holding more than its size is not attached again until it is
/// grown. Where the storage holds no limit itself (a directory on a shared filesystem),
/// this is how a size holds: what was written past it stays, and the next booking waits.
/// On Kubernetes the same rule reads the kubelet's figure, which [`own_use`] keeps only
/// where the claim's filesystem is no larger than the volume, so storage that holds the
/// claim's size never trips it. `None` (never measured) passes.
pub fn check_within_size(name: &str, size_gib: u32, used_bytes: Option<i64>) -> Result<(), Refusal> {
    const GIB: i64 = 1 << 30;
    let Some(used) = used_bytes.filter(|used| *used > i64::from(size_gib) * GIB) else { return Ok(()) };
    let needed_gib = u32::try_from((used + GIB - 1) / GIB).unwrap_or(u32::MAX);
    let tenths = (used.saturating_mul(10) + GIB / 2) / GIB;
    let used = format!("{}.{}", tenths / 10, tenths % 10);
    Err(Refusal::VolumeOverSize { name: name.to_owned(), used, size_gib, needed_gib })
}

/// What a measurement says of a volume's use: `used_bytes`, unless it came with the size of
/// the filesystem it was taken on (`capacity_bytes`, as the kubelet reports a claim's) and
/// that filesystem is larger than the volume. Then the figure is a shared export's (an NFS
/// subdirectory, EFS: the kubelet reports the whole export), other volumes' data included,
/// and is neither the volume's use to show nor a reason to refuse it: `None`.
pub fn own_use(size_gib: u32, used_bytes: u64, capacity_bytes: Option<u64>) -> Option<u64> {
    const GIB: u64 = 1 << 30;
    match capacity_bytes {
        Some(capacity) if capacity > u64::from(size_gib) * GIB => None,
        _ => Some(used_bytes),
    }
}

/// Where a volume appears inside an environment.
pub fn mount_path(name: &str, is_home: bool) -> String {
    if is_home { HOME_MOUNT.to_owned() } else { format!("{DATA_ROOT}/{name}") }
}

/// Whether `booking` may attach `volume`: one's own personal volumes, and the volumes of
/// the project the booking is in; never another tenant's. A volume out of reach is
/// answered like one that does not exist.
pub fn may_attach(volume: &VolumeFacts, booking: BookingFacts) -> Result<(), Refusal> {
    let unknown = || Refusal::UnknownVolume(volume.name.clone());
    if volume.tenant_id != booking.tenant_id {
        return Err(unknown());
    }
    match volume.scope {
        VolumeScope::Personal if volume.owner_id == booking.owner_id => Ok(()),
        VolumeScope::Personal => Err(unknown()),
        VolumeScope::Project(project) if booking.project_id == Some(project) => Ok(()),
        VolumeScope::Project(_) => Err(Refusal::VolumeNotInProject(volume.name.clone())),
    }
}

/// The mount paths of the volumes one booking attaches, in order; two volumes at one path
/// (a personal and a project volume of the same name) are refused.
pub fn mounts(volumes: &[VolumeFacts]) -> Result<Vec<String>, Refusal> {
    let mut paths: Vec<String> = Vec::with_capacity(volumes.len());
    for volume in volumes {
        let path = mount_path(&volume.name, volume.is_home);
        if paths.contains(&path) {
            return Err(Refusal::VolumeMountClash(path));
        }
        paths.push(path);
    }
    Ok(paths)
}

/// One limit a volume counts against, with what its volumes take already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageLimit {
    /// "project vision", "tenant acme".
    pub whose: String,
    pub limit_gib: u64,
    pub used_gib: u64,
}

impl StorageLimit {
    pub fn left_gib(&self) -> u64 {
        self.limit_gib.saturating_sub(self.used_gib)
    }
}

/// Whether `asked_gib` more fits every limit; the refusal names the first that it does not
/// fit, and what is left of it.
pub fn check_storage_quota(limits: &[StorageLimit], asked_gib: u64) -> Result<(), Refusal> {
    for limit in limits {
        if limit.used_gib.saturating_add(asked_gib) > limit.limit_gib {
            return Err(Refusal::StorageQuotaExceeded(format!(
                "{} has {} GiB of {} GiB left; {asked_gib} GiB asked",
                limit.whose,
                limit.left_gib(),
                limit.limit_gib
            )));
        }
    }
    Ok(())
}

/// The volume ids a launch asks to attach, as the form or the API sends them: ids, once
/// each, in the order asked.
pub fn parse_volume_ids(asked: &[String]) -> Result<Vec<i64>, Refusal> {
    let mut ids = Vec::new();
    for raw in asked.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let id: i64 = raw.parse().map_err(|_| Refusal::UnknownVolume(raw.to_owned()))?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn volume(tenant: Option<i64>, owner: i64, scope: VolumeScope) -> VolumeFacts {
        VolumeFacts { name: "data".into(), tenant_id: tenant, owner_id: owner, scope, is_home: false }
    }

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(validate_name(" datasets-2 ").unwrap(), "datasets-2");
        for bad in ["", "Data", "2data", "data-", "da_ta", "dätä", "home", &"a".repeat(64)] {
            let refusal = validate_name(bad).unwrap_err();
            assert!(matches!(refusal, Refusal::InvalidVolumeName(_)), "{bad}: {refusal}");
        }
        assert!(validate_name(&"a".repeat(63)).is_ok());
        assert!(validate_name("Data").unwrap_err().to_string().contains("lowercase letters"));
    }

    #[test]
    fn sizes_are_whole_gib_within_limits() {
        assert_eq!(parse_size("100").unwrap(), 100);
        for bad in ["0", "-1", "1.5", "", "ten", "65537"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(check_resize(10, "20").unwrap(), 20);
        assert!(check_resize(10, "10").unwrap_err().to_string().contains("only grows"));
        assert!(check_resize(10, "5").is_err());
    }

    #[test]
    fn a_volume_over_its_size_waits_to_be_grown() {
        const GIB: i64 = 1 << 30;
        assert_eq!(check_within_size("data", 10, None), Ok(()), "not measured");
        assert_eq!(check_within_size("data", 10, Some(10 * GIB)), Ok(()), "full is not over");
        let over = check_within_size("data", 10, Some(12 * GIB + GIB / 2)).unwrap_err();
        assert_eq!(
            over.to_string(),
            "volume \"data\" holds 12.5 GiB, more than its 10 GiB; grow it to 13 GiB or more on the volumes page to attach it again"
        );
    }

    #[test]
    fn a_figure_of_a_filesystem_larger_than_the_volume_is_not_its_use() {
        const GIB: u64 = 1 << 30;
        assert_eq!(own_use(10, 3 * GIB, None), Some(3 * GIB), "a directory's own files");
        // Block storage formatted on the claim: a little less than its size.
        assert_eq!(own_use(10, 3 * GIB, Some(10 * GIB - (300 << 20))), Some(3 * GIB));
        assert_eq!(own_use(10, 3 * GIB, Some(10 * GIB)), Some(3 * GIB), "a quota of exactly the size (CephFS)");
        // A grown volume whose filesystem has not followed yet is still its own.
        assert_eq!(own_use(20, 3 * GIB, Some(10 * GIB)), Some(3 * GIB));
        // An NFS export of 2 TiB shared by every claim: its use is everyone's.
        assert_eq!(own_use(10, 700 * GIB, Some(2048 * GIB)), None);
        assert_eq!(own_use(10, GIB, Some(10 * GIB + 1)), None);
    }

    #[test]
    fn home_and_data_mounts() {
        assert_eq!(mount_path("home", true), "/home/jovyan/work");
        assert_eq!(mount_path("datasets", false), "/data/datasets");
        let two = [volume(Some(1), 1, VolumeScope::Personal), volume(Some(1), 2, VolumeScope::Project(3))];
        assert_eq!(mounts(&two).unwrap_err(), Refusal::VolumeMountClash("/data/data".into()));
    }

    #[test]
    fn who_may_attach_what() {
        let booking = BookingFacts { tenant_id: Some(1), owner_id: 10, project_id: Some(5) };
        assert!(may_attach(&volume(Some(1), 10, VolumeScope::Personal), booking).is_ok());
        assert!(may_attach(&volume(Some(1), 11, VolumeScope::Project(5)), booking).is_ok());
        // Someone else's personal volume, another project's, another tenant's.
        assert!(matches!(
            may_attach(&volume(Some(1), 11, VolumeScope::Personal), booking),
            Err(Refusal::UnknownVolume(_))
        ));
        assert!(matches!(
            may_attach(&volume(Some(1), 10, VolumeScope::Project(6)), booking),
            Err(Refusal::VolumeNotInProject(_))
        ));
        assert!(matches!(
            may_attach(&volume(Some(2), 10, VolumeScope::Project(5)), booking),
            Err(Refusal::UnknownVolume(_))
        ));
        // A booking in no project attaches no project volume.
        let alone = BookingFacts { project_id: None, ..booking };
        assert!(may_attach(&volume(Some(1), 10, VolumeScope::Project(5)), alone).is_err());
    }

    #[test]
    fn a_quota_refusal_says_whose_limit_and_what_is_left() {
        let limits = [
            StorageLimit { whose: "tenant acme".into(), limit_gib: 1000, used_gib: 100 },
            StorageLimit { whose: "project vision".into(), limit_gib: 500, used_gib: 460 },
        ];
        assert!(check_storage_quota(&limits, 40).is_ok());
        assert_eq!(
            check_storage_quota(&limits, 100).unwrap_err().to_string(),
            "storage quota: project vision has 40 GiB of 500 GiB left; 100 GiB asked"
        );
    }

    #[test]
    fn volume_ids_once_each() {
        assert_eq!(parse_volume_ids(&["3".into(), " 4".into(), "3".into(), "".into()]).unwrap(), vec![3, 4]);
        assert!(parse_volume_ids(&["x".into()]).is_err());
    }

    proptest! {
        #[test]
        fn a_quota_never_lets_usage_past_its_limit(limit in 0u64..10_000, used in 0u64..10_000, asked in 1u64..10_000) {
            let limits = [StorageLimit { whose: "tenant t".into(), limit_gib: limit, used_gib: used }];
            let fits = check_storage_quota(&limits, asked).is_ok();
            prop_assert_eq!(fits, used + asked <= limit);
        }

        #[test]
        fn every_accepted_name_is_a_dns_label(name in "[a-z0-9-]{0,70}") {
            if let Ok(ok) = validate_name(&name) {
                prop_assert!(ok.len() <= 63 && !ok.is_empty());
                prop_assert!(ok.starts_with(|c: char| c.is_ascii_lowercase()));
                prop_assert!(!ok.ends_with('-'));
                prop_assert_eq!(mount_path(&ok, false), format!("/data/{ok}"));
            }
        }
    }
}
