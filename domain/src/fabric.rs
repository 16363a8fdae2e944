//! Fabric isolation for hard and hybrid tenants: the identifiers a tenant holds (a network
//! segment, an InfiniBand P_Key, an NVLink partition and a storage volume), the pools they
//! come from, the quarantine before a released one is handed out again, the tenant's
//! InfiniBand port GUIDs, and the OpenSM `partitions.conf` fragment that puts those ports
//! into the tenant's partition.
//!
//! The database holds the leases; this module decides which value a new lease gets.

use std::fmt;
use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::booking::HOUR_MS;
use crate::tenancy::Isolation;

/// What kind of identifier a lease holds. Each kind has its own pool and its own
/// uniqueness: VLAN 100 and VNI 100 are different identifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum IdentifierKind {
    /// An 802.1Q VLAN id.
    Vlan,
    /// A VXLAN network identifier.
    Vni,
    /// An InfiniBand partition key (its 15-bit base).
    PKey,
    /// A partition id that NVIDIA Fabric Manager (or NMX) activates on the NVSwitches.
    NvlinkPartition,
    /// The number behind a tenant's storage volume name.
    Volume,
}

impl IdentifierKind {
    pub const ALL: [IdentifierKind; 5] = [
        IdentifierKind::Vlan,
        IdentifierKind::Vni,
        IdentifierKind::PKey,
        IdentifierKind::NvlinkPartition,
        IdentifierKind::Volume,
    ];

    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentifierKind::Vlan => "vlan",
            IdentifierKind::Vni => "vni",
            IdentifierKind::PKey => "pkey",
            IdentifierKind::NvlinkPartition => "nvlink",
            IdentifierKind::Volume => "volume",
        }
    }

    pub fn parse(s: &str) -> Option<IdentifierKind> {
        IdentifierKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// What people call it.
    pub fn label(self) -> &'static str {
        match self {
            IdentifierKind::Vlan => "VLAN id",
            IdentifierKind::Vni => "VXLAN VNI",
            IdentifierKind::PKey => "InfiniBand P_Key",
            IdentifierKind::NvlinkPartition => "NVLink partition",
            IdentifierKind::Volume => "storage volume",
        }
    }

    /// Every value the protocol allows for this kind; a pool lies inside it.
    ///
    /// - VLAN: 0 tags priority only, 1 is the default VLAN every port starts in and 4095 is
    ///   reserved by 802.1Q, so none of them isolates anything.
    /// - VNI: 24 bits; 0 is left out because several VTEPs treat it as "no VNI".
    /// - P_Key: the 15-bit base; 0 is invalid and 0x7FFF is the default partition that
    ///   every port is in.
    /// - NVLink: on HGX baseboards partition 0 spans every GPU, so it isolates nothing.
    pub fn valid(self) -> RangeInclusive<u32> {
        match self {
            IdentifierKind::Vlan => 2..=4094,
            IdentifierKind::Vni => 1..=0xFF_FFFF,
            IdentifierKind::PKey => 0x0001..=0x7FFE,
            IdentifierKind::NvlinkPartition => 1..=0xFFFF,
            IdentifierKind::Volume => 1..=999_999,
        }
    }

    /// A value as operators write it: P_Keys in hex, volumes by name, the rest in decimal.
    pub fn show(self, value: u32) -> String {
        match self {
            IdentifierKind::PKey => format!("0x{value:04x}"),
            IdentifierKind::Volume => volume_name(value),
            _ => value.to_string(),
        }
    }
}

/// The name of storage volume number `n` on the storage system.
pub fn volume_name(n: u32) -> String {
    format!("berth-v{n:06}")
}

/// An InfiniBand partition key. Berth hands out the 15-bit base; the top bit says full
/// (1) or limited (0) membership and is set per port, not per partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PKey(u16);

impl PKey {
    /// The bit that marks full membership in a port's P_Key table and on the wire.
    pub const FULL_MEMBER: u16 = 0x8000;
    /// The default partition every port is in.
    pub const DEFAULT: u16 = 0x7FFF;

    /// A P_Key base from a lease value: 0x0001..=0x7FFE.
    pub fn new(base: u32) -> Result<PKey, Refusal> {
        if IdentifierKind::PKey.valid().contains(&base) {
            Ok(PKey(base as u16))
        } else {
            Err(Refusal::InvalidFabricPool(format!(
                "P_Key 0x{base:04x} is outside 0x0001-0x7ffe (0x7fff is the default partition)"
            )))
        }
    }

    pub fn base(self) -> u16 {
        self.0
    }

    /// What a full member's port holds and a host uses (e.g. for an IPoIB child interface).
    pub fn full_member(self) -> u16 {
        self.0 | PKey::FULL_MEMBER
    }
}

impl fmt::Display for PKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:04x}", self.0)
    }
}

/// Which network segment hard tenants get: one operator-wide choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NetworkSegment {
    Vlan,
    Vxlan,
}

impl NetworkSegment {
    pub fn kind(self) -> IdentifierKind {
        match self {
            NetworkSegment::Vlan => IdentifierKind::Vlan,
            NetworkSegment::Vxlan => IdentifierKind::Vni,
        }
    }

    pub fn parse(s: &str) -> Result<NetworkSegment, Refusal> {
        match s.trim() {
            "vlan" => Ok(NetworkSegment::Vlan),
            "vxlan" => Ok(NetworkSegment::Vxlan),
            other => Err(Refusal::InvalidFabricPool(format!("network segment must be vlan or vxlan, not \"{other}\""))),
        }
    }
}

/// The values of one kind that Berth may hand out: `first..=last`, inside what the kind
/// allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    pub kind: IdentifierKind,
    pub first: u32,
    pub last: u32,
}

impl Pool {
    pub fn new(kind: IdentifierKind, first: u32, last: u32) -> Result<Pool, Refusal> {
        let valid = kind.valid();
        if first > last {
            return Err(Refusal::InvalidFabricPool(format!(
                "{} pool {}-{} ends before it starts",
                kind.label(),
                kind.show(first),
                kind.show(last)
            )));
        }
        if !valid.contains(&first) || !valid.contains(&last) {
            let whole = Pool { kind, first: *valid.start(), last: *valid.end() };
            return Err(Refusal::InvalidFabricPool(format!(
                "{} pool {}-{} must lie within {}",
                kind.label(),
                kind.show(first),
                kind.show(last),
                whole.range()
            )));
        }
        Ok(Pool { kind, first, last })
    }

    /// Every value the kind allows.
    pub fn whole(kind: IdentifierKind) -> Pool {
        let valid = kind.valid();
        Pool { kind, first: *valid.start(), last: *valid.end() }
    }

    /// `first-last` or one value, each decimal or `0x` hex (`100-199`, `0x0010-0x00ff`).
    pub fn parse(kind: IdentifierKind, text: &str) -> Result<Pool, Refusal> {
        let number = |s: &str| {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                Some(hex) => u32::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.map_err(|_| {
                Refusal::InvalidFabricPool(format!(
                    "{} pool \"{}\" is not first-last (decimal or 0x hex)",
                    kind.label(),
                    text.trim()
                ))
            })
        };
        let (first, last) = match text.split_once('-') {
            Some((first, last)) => (number(first)?, number(last)?),
            None => {
                let one = number(text)?;
                (one, one)
            }
        };
        Pool::new(kind, first, last)
    }

    pub fn contains(&self, value: u32) -> bool {
        (self.first..=self.last).contains(&value)
    }

    pub fn size(&self) -> u64 {
        u64::from(self.last - self.first) + 1
    }

    /// `first-last` as operators write the kind's values.
    pub fn range(&self) -> String {
        let show = |v: u32| match self.kind {
            // A range of volume names reads badly; their numbers are what is pooled.
            IdentifierKind::Volume => v.to_string(),
            kind => kind.show(v),
        };
        format!("{}-{}", show(self.first), show(self.last))
    }

    /// The lowest value of the pool that no lease of its kind blocks at `now`.
    pub fn lowest_free(&self, leases: &[FabricLease], now: i64) -> Option<u32> {
        let mut blocked: Vec<u32> = leases
            .iter()
            .filter(|l| l.kind == self.kind && l.blocks(now) && self.contains(l.value))
            .map(|l| l.value)
            .collect();
        blocked.sort_unstable();
        blocked.dedup();
        // Walk up from the pool's start: the first gap in the sorted blocked values.
        let mut candidate = self.first;
        for value in blocked {
            if value > candidate {
                break;
            }
            if value == candidate {
                if candidate == self.last {
                    return None;
                }
                candidate += 1;
            }
        }
        Some(candidate)
    }

    /// The value a new lease gets, or why there is none.
    pub fn allocate(&self, leases: &[FabricLease], now: i64) -> Result<u32, Refusal> {
        self.lowest_free(leases, now).ok_or_else(|| {
            let in_quarantine = leases
                .iter()
                .filter(|l| l.kind == self.kind && !l.is_held() && l.blocks(now) && self.contains(l.value))
                .count();
            Refusal::FabricPoolExhausted { what: self.kind.label(), range: self.range(), in_quarantine }
        })
    }
}

/// One identifier handed to one tenant: held until released, then in quarantine until
/// `quarantine_until`, then free again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricLease {
    pub kind: IdentifierKind,
    pub value: u32,
    pub tenant_id: i64,
    pub held_at: i64,
    pub released_at: Option<i64>,
    pub quarantine_until: Option<i64>,
}

impl FabricLease {
    pub fn is_held(&self) -> bool {
        self.released_at.is_none()
    }

    /// Whether the value may not be handed out at `now`: still held, or released less
    /// than the quarantine ago (switches, subnet managers and hosts may still carry it).
    pub fn blocks(&self, now: i64) -> bool {
        match (self.released_at, self.quarantine_until) {
            (None, _) => true,
            (Some(_), Some(until)) => now < until,
            (Some(released), None) => now < released,
        }
    }
}

/// When an identifier released at `released_at` may be handed out again.
pub fn quarantine_end(released_at: i64, quarantine_ms: i64) -> i64 {
    released_at.saturating_add(quarantine_ms.max(0))
}

/// The operator's fabric settings: which segment kind, the pools, the quarantine and the
/// size of a new tenant's volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricConfig {
    pub segment: NetworkSegment,
    pub vlans: Pool,
    pub vnis: Pool,
    pub pkeys: Pool,
    pub nvlink_partitions: Pool,
    pub volumes: Pool,
    pub quarantine_ms: i64,
    pub volume_quota_bytes: i64,
}

/// Bytes in a GiB, for volume quotas.
pub const GIB: i64 = 1 << 30;

impl Default for FabricConfig {
    fn default() -> FabricConfig {
        FabricConfig {
            segment: NetworkSegment::Vlan,
            vlans: Pool::whole(IdentifierKind::Vlan),
            vnis: Pool::whole(IdentifierKind::Vni),
            pkeys: Pool::whole(IdentifierKind::PKey),
            nvlink_partitions: Pool::whole(IdentifierKind::NvlinkPartition),
            volumes: Pool::whole(IdentifierKind::Volume),
            quarantine_ms: 24 * HOUR_MS,
            volume_quota_bytes: 1024 * GIB,
        }
    }
}

impl FabricConfig {
    pub fn pool(&self, kind: IdentifierKind) -> &Pool {
        match kind {
            IdentifierKind::Vlan => &self.vlans,
            IdentifierKind::Vni => &self.vnis,
            IdentifierKind::PKey => &self.pkeys,
            IdentifierKind::NvlinkPartition => &self.nvlink_partitions,
            IdentifierKind::Volume => &self.volumes,
        }
    }

    /// The identifiers a tenant with `isolation` holds: hard and hybrid tenants one network
    /// segment, one P_Key, one NVLink partition and one storage volume; soft tenants none.
    pub fn needed(&self, isolation: Isolation) -> Vec<IdentifierKind> {
        match isolation {
            Isolation::Soft => Vec::new(),
            Isolation::Hard | Isolation::Hybrid => {
                vec![self.segment.kind(), IdentifierKind::PKey, IdentifierKind::NvlinkPartition, IdentifierKind::Volume]
            }
        }
    }

    /// What a tenant holding `held` still lacks. A segment of the other kind (held from
    /// before the operator switched between VLAN and VXLAN) still counts: the tenant keeps
    /// its working network rather than getting a second one.
    pub fn missing(&self, isolation: Isolation, held: &[IdentifierKind]) -> Vec<IdentifierKind> {
        let has_segment = held.iter().any(|k| matches!(k, IdentifierKind::Vlan | IdentifierKind::Vni));
        self.needed(isolation)
            .into_iter()
            .filter(|kind| match kind {
                IdentifierKind::Vlan | IdentifierKind::Vni => !has_segment,
                kind => !held.contains(kind),
            })
            .collect()
    }
}

/// The most port GUIDs one tenant may list: keeps forms and partitions.conf bounded.
pub const MAX_PORT_GUIDS: usize = 4096;

/// An InfiniBand port GUID (EUI-64), written `0x` and 16 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PortGuid(u64);

impl PortGuid {
    /// Exactly `0x` and 16 hex digits (either case); zero is refused because OpenSM
    /// rejects it as "bad PortGUID" and drops the whole rest of the file.
    pub fn parse(text: &str) -> Result<PortGuid, Refusal> {
        let text = text.trim();
        let bad = || Refusal::InvalidPortGuid(text.to_owned());
        let hex = text.strip_prefix("0x").ok_or_else(bad)?;
        if hex.len() != 16 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad());
        }
        match u64::from_str_radix(hex, 16) {
            Ok(0) | Err(_) => Err(bad()),
            Ok(guid) => Ok(PortGuid(guid)),
        }
    }

    pub fn value(self) -> u64 {
        self.0
    }
}

impl fmt::Display for PortGuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:016x}", self.0)
    }
}

/// The GUIDs an admin typed, separated by spaces, commas or new lines; repeats are kept
/// once, in the order first given.
pub fn parse_port_guids(text: &str) -> Result<Vec<PortGuid>, Refusal> {
    let mut guids: Vec<PortGuid> = Vec::new();
    for word in text.split(|c: char| c.is_whitespace() || c == ',' || c == ';').filter(|w| !w.is_empty()) {
        let guid = PortGuid::parse(word)?;
        if !guids.contains(&guid) {
            guids.push(guid);
        }
    }
    if guids.len() > MAX_PORT_GUIDS {
        return Err(Refusal::TooManyPortGuids { max: MAX_PORT_GUIDS });
    }
    Ok(guids)
}

/// One tenant's InfiniBand partition: its P_Key and its ports, all full members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantPartition {
    /// The tenant's short name; used as the partition's name in OpenSM's logs.
    pub name: String,
    pub pkey: PKey,
    pub ports: Vec<PortGuid>,
}

/// Port GUIDs per line of partitions.conf: OpenSM reads lines into a 4096-byte buffer,
/// so long lists continue on the next line (allowed after the `:` and between ports).
const GUIDS_PER_LINE: usize = 8;

/// The OpenSM `partitions.conf` fragment for these tenants, one partition per tenant in
/// P_Key order:
///
/// `acme=0x0002, ipoib, defmember=full : 0x0002c9030001e3f1=full, 0x0002c9030001e3f2=full ;`
///
/// The P_Key is written as its 15-bit base (OpenSM uses only the low 15 bits there) and
/// membership is given per port with `=full`; the full-member key a host sees (0x8002)
/// is in the comment above each partition. Leaving out a `Default=0x7fff` rule is on
/// purpose: OpenSM then makes every port only a limited member of the default partition,
/// so tenants cannot reach each other through it.
pub fn partitions_conf(partitions: &[TenantPartition]) -> String {
    let mut sorted: Vec<&TenantPartition> = partitions.iter().collect();
    sorted.sort_by_key(|p| p.pkey);
    let mut out = String::from(
        "# OpenSM partitions for Berth's hard and hybrid tenants. Generated by Berth: change\n\
         # the tenants' port GUIDs in Berth, not here.\n",
    );
    for partition in sorted {
        // OpenSM splits on = , : ; # and spaces; a slug has none of them, but this keeps
        // any other name from breaking the file.
        let name: String = partition
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
            .collect();
        let ports = match partition.ports.len() {
            0 => "no ports yet".to_owned(),
            1 => "1 port".to_owned(),
            n => format!("{n} ports"),
        };
        out.push_str(&format!(
            "# {name}: full-member P_Key 0x{:04x}, {ports}\n{name}={}, ipoib, defmember=full :",
            partition.pkey.full_member(),
            partition.pkey
        ));
        let lines: Vec<String> = partition
            .ports
            .chunks(GUIDS_PER_LINE)
            .map(|chunk| chunk.iter().map(|g| format!("{g}=full")).collect::<Vec<_>>().join(", "))
            .collect();
        match lines.as_slice() {
            [] => out.push_str(" ;\n"),
            [one] => out.push_str(&format!(" {one} ;\n")),
            many => {
                out.push('\n');
                out.push_str(&many.iter().map(|l| format!("    {l}")).collect::<Vec<_>>().join(",\n"));
                out.push_str(" ;\n");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(kind: IdentifierKind, value: u32, released_at: Option<i64>, quarantine_ms: i64) -> FabricLease {
        FabricLease {
            kind,
            value,
            tenant_id: 1,
            held_at: 0,
            released_at,
            quarantine_until: released_at.map(|r| quarantine_end(r, quarantine_ms)),
        }
    }

    #[test]
    fn kinds_round_trip_and_reserved_values_are_outside() {
        for kind in IdentifierKind::ALL {
            assert_eq!(IdentifierKind::parse(kind.as_str()), Some(kind));
        }
        let vlan = IdentifierKind::Vlan.valid();
        assert!(!vlan.contains(&1) && !vlan.contains(&4095) && vlan.contains(&2) && vlan.contains(&4094));
        let vni = IdentifierKind::Vni.valid();
        assert!(!vni.contains(&0) && vni.contains(&16_777_215) && !vni.contains(&16_777_216));
        let pkey = IdentifierKind::PKey.valid();
        assert!(!pkey.contains(&0) && pkey.contains(&0x7FFE) && !pkey.contains(&0x7FFF));
    }

    #[test]
    fn pkeys_render_their_base_and_know_their_full_member_key() {
        let pkey = PKey::new(2).expect("valid");
        assert_eq!(pkey.to_string(), "0x0002");
        assert_eq!(pkey.full_member(), 0x8002);
        assert!(PKey::new(0x7FFF).is_err());
        assert!(PKey::new(0).is_err());
        assert!(PKey::new(0x8001).is_err());
    }

    #[test]
    fn pools_parse_and_stay_inside_their_kind() {
        assert_eq!(Pool::parse(IdentifierKind::Vlan, "100-199"), Pool::new(IdentifierKind::Vlan, 100, 199));
        assert_eq!(Pool::parse(IdentifierKind::PKey, "0x0010-0x00ff").map(|p| (p.first, p.last)), Ok((0x10, 0xff)));
        assert_eq!(Pool::parse(IdentifierKind::Vni, " 5000 ").map(|p| p.size()), Ok(1));
        assert_eq!(Pool::parse(IdentifierKind::PKey, "0x0001-0x7ffe").map(|p| p.range()), Ok("0x0001-0x7ffe".into()));
        for (kind, bad) in [
            (IdentifierKind::Vlan, "1-100"),
            (IdentifierKind::Vlan, "100-4095"),
            (IdentifierKind::Vlan, "200-100"),
            (IdentifierKind::Vlan, "a-b"),
            (IdentifierKind::Vni, "0-10"),
            (IdentifierKind::Vni, "1-16777216"),
            (IdentifierKind::PKey, "0x7000-0x7fff"),
            (IdentifierKind::NvlinkPartition, "0-4"),
        ] {
            assert!(Pool::parse(kind, bad).is_err(), "{kind:?} {bad}");
        }
    }

    #[test]
    fn allocation_takes_the_lowest_value_neither_held_nor_in_quarantine() {
        let pool = Pool::new(IdentifierKind::Vlan, 100, 103).expect("pool");
        let day = 24 * HOUR_MS;
        let leases = [
            lease(IdentifierKind::Vlan, 100, None, day),
            lease(IdentifierKind::Vlan, 101, Some(1_000), day),
            // Another kind's 102 does not block VLAN 102.
            lease(IdentifierKind::Vni, 102, None, day),
        ];
        assert_eq!(pool.allocate(&leases, 2_000), Ok(102));
        // Once 101's quarantine is over, it is the lowest free value again.
        assert_eq!(pool.allocate(&leases, 1_000 + day - 1), Ok(102));
        assert_eq!(pool.allocate(&leases, 1_000 + day), Ok(101));
    }

    #[test]
    fn an_exhausted_pool_says_which_and_how_many_wait_in_quarantine() {
        let pool = Pool::new(IdentifierKind::PKey, 2, 3).expect("pool");
        let leases = [lease(IdentifierKind::PKey, 2, None, HOUR_MS), lease(IdentifierKind::PKey, 3, Some(0), HOUR_MS)];
        let refusal = pool.allocate(&leases, 10).expect_err("exhausted");
        assert_eq!(
            refusal,
            Refusal::FabricPoolExhausted { what: "InfiniBand P_Key", range: "0x0002-0x0003".into(), in_quarantine: 1 }
        );
        assert!(refusal.to_string().contains("no free InfiniBand P_Key"), "{refusal}");
        assert_eq!(pool.allocate(&leases, HOUR_MS), Ok(3));
    }

    #[test]
    fn hard_and_hybrid_tenants_need_four_identifiers_and_soft_none() {
        let config = FabricConfig::default();
        assert!(config.needed(Isolation::Soft).is_empty());
        let hard = config.needed(Isolation::Hard);
        assert_eq!(
            hard,
            vec![IdentifierKind::Vlan, IdentifierKind::PKey, IdentifierKind::NvlinkPartition, IdentifierKind::Volume]
        );
        assert_eq!(config.needed(Isolation::Hybrid), hard);
        let vxlan = FabricConfig { segment: NetworkSegment::Vxlan, ..FabricConfig::default() };
        assert_eq!(vxlan.needed(Isolation::Hard)[0], IdentifierKind::Vni);
        // A VLAN held from before a switch to VXLAN still counts as the segment.
        assert_eq!(
            vxlan.missing(Isolation::Hard, &[IdentifierKind::Vlan, IdentifierKind::PKey]),
            vec![IdentifierKind::NvlinkPartition, IdentifierKind::Volume]
        );
        assert!(config.missing(Isolation::Hard, &hard).is_empty());
    }

    #[test]
    fn port_guids_are_0x_and_16_hex_digits() {
        assert_eq!(PortGuid::parse("0x0002C9030001E3F1").map(|g| g.to_string()), Ok("0x0002c9030001e3f1".into()));
        for bad in
            ["0002c9030001e3f1", "0x2c9030001e3f1", "0x0002c9030001e3f1a", "0x0002c9030001e3g1", "0X0002c9030001e3f1"]
        {
            assert_eq!(PortGuid::parse(bad), Err(Refusal::InvalidPortGuid(bad.into())), "{bad}");
        }
        assert!(PortGuid::parse("0x0000000000000000").is_err());
        let guids = parse_port_guids("0x0002c9030001e3f1, 0x0002c9030001e3f2\n0x0002C9030001E3F1").expect("parses");
        assert_eq!(guids.len(), 2);
        assert!(parse_port_guids("0x0002c9030001e3f1 nope").is_err());
        assert_eq!(parse_port_guids("  "), Ok(vec![]));
    }

    #[test]
    fn partitions_conf_follows_the_opensm_syntax() {
        let guid = |s| PortGuid::parse(s).expect("guid");
        let conf = partitions_conf(&[
            TenantPartition { name: "globex".into(), pkey: PKey::new(3).expect("pkey"), ports: vec![] },
            TenantPartition {
                name: "acme".into(),
                pkey: PKey::new(2).expect("pkey"),
                ports: vec![guid("0x0002c9030001e3f1"), guid("0x0002c9030001e3f2")],
            },
        ]);
        let lines: Vec<&str> = conf.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            vec![
                "acme=0x0002, ipoib, defmember=full : 0x0002c9030001e3f1=full, 0x0002c9030001e3f2=full ;",
                "globex=0x0003, ipoib, defmember=full : ;",
            ]
        );
        assert!(conf.contains("# acme: full-member P_Key 0x8002, 2 ports"), "{conf}");
        assert!(!conf.contains("0x7fff"), "no rule for the default partition");
    }

    #[test]
    fn long_port_lists_wrap_between_ports_within_opensm_line_limit() {
        let ports: Vec<PortGuid> =
            (1..=MAX_PORT_GUIDS as u64).map(|n| PortGuid::parse(&format!("0x{n:016x}")).expect("guid")).collect();
        let conf = partitions_conf(&[TenantPartition { name: "big".into(), pkey: PKey::new(9).expect("pkey"), ports }]);
        assert!(conf.lines().all(|l| l.len() < 4096));
        let body: Vec<&str> = conf.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(body[0], "big=0x0009, ipoib, defmember=full :");
        assert!(body[1..body.len() - 1].iter().all(|l| l.ends_with(',')));
        assert!(body[body.len() - 1].ends_with("=full ;"));
        assert_eq!(conf.matches("=full").count(), MAX_PORT_GUIDS + 1, "each port full, plus defmember");
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        const KINDS: [IdentifierKind; 5] = IdentifierKind::ALL;

        fn small_pool() -> impl Strategy<Value = Pool> {
            (0..KINDS.len(), 0u32..40, 0u32..12).prop_map(|(k, offset, len)| {
                let kind = KINDS[k];
                let first = kind.valid().start() + offset;
                Pool { kind, first, last: first + len }
            })
        }

        fn leases_near(pool: Pool) -> impl Strategy<Value = Vec<FabricLease>> {
            let lease = (0..KINDS.len(), 0u32..60, proptest::option::of(0i64..1_000), 0i64..500).prop_map(
                move |(k, offset, released_at, quarantine)| {
                    // Mostly the pool's own kind, with values a little below and past it.
                    let kind = if k < 3 { pool.kind } else { KINDS[k] };
                    FabricLease {
                        kind,
                        value: (kind.valid().start() + offset).min(*kind.valid().end()),
                        tenant_id: 1,
                        held_at: 0,
                        released_at,
                        quarantine_until: released_at.map(|r| quarantine_end(r, quarantine)),
                    }
                },
            );
            proptest::collection::vec(lease, 0..30)
        }

        proptest! {
            /// Whatever was handed out and released before, a new lease gets a value of
            /// the pool that is neither held nor in quarantine, and none only when every
            /// value of the pool is one of those.
            #[test]
            fn allocation_never_hands_out_a_value_outside_the_pool_or_in_quarantine(
                (pool, leases) in small_pool().prop_flat_map(|pool| (Just(pool), leases_near(pool))),
                now in 0i64..2_000,
            ) {
                let blocked = |v: u32| leases.iter().any(|l| l.kind == pool.kind && l.value == v && l.blocks(now));
                match pool.allocate(&leases, now) {
                    Ok(value) => {
                        prop_assert!(pool.contains(value));
                        prop_assert!(!blocked(value), "{value} is held or in quarantine");
                        prop_assert!((pool.first..value).all(blocked), "{value} is not the lowest free");
                        for lease in leases.iter().filter(|l| l.kind == pool.kind && l.value == value) {
                            let until = lease.quarantine_until.unwrap_or(i64::MAX);
                            prop_assert!(lease.released_at.is_some() && until <= now);
                        }
                    }
                    Err(_) => prop_assert!((pool.first..=pool.last).all(blocked)),
                }
            }

            /// Allocating and releasing over time, as tenants come and go, never gives one
            /// value to two holders nor reuses one within its quarantine.
            #[test]
            fn a_history_of_holds_and_releases_never_overlaps(
                steps in proptest::collection::vec((any::<bool>(), 0usize..8, 0i64..40), 1..80),
                quarantine in 0i64..100,
            ) {
                let pool = Pool::new(IdentifierKind::PKey, 2, 6).expect("pool");
                let mut leases: Vec<FabricLease> = Vec::new();
                let mut now = 0;
                for (allocate, pick, advance) in steps {
                    now += advance;
                    if allocate {
                        if let Ok(value) = pool.allocate(&leases, now) {
                            for earlier in leases.iter().filter(|l| l.value == value) {
                                prop_assert!(earlier.released_at.is_some());
                                prop_assert!(earlier.quarantine_until.is_some_and(|until| until <= now));
                            }
                            leases.push(FabricLease {
                                kind: pool.kind, value, tenant_id: 1, held_at: now,
                                released_at: None, quarantine_until: None,
                            });
                        }
                    } else {
                        let held: Vec<usize> = (0..leases.len()).filter(|&i| leases[i].is_held()).collect();
                        if let Some(&i) = held.get(pick % held.len().max(1)) {
                            leases[i].released_at = Some(now);
                            leases[i].quarantine_until = Some(quarantine_end(now, quarantine));
                        }
                    }
                    let mut held: Vec<u32> = leases.iter().filter(|l| l.is_held()).map(|l| l.value).collect();
                    let count = held.len();
                    held.sort_unstable();
                    held.dedup();
                    prop_assert_eq!(held.len(), count, "a value held twice");
                }
            }
        }
    }
}
