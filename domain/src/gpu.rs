//! The GPU models Berth knows, with the facts placement and pricing need.

use serde::{Deserialize, Serialize};

#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum GpuModel {
    #[serde(rename = "A100-40GB")]
    A100_40GB,
    #[serde(rename = "A100-80GB")]
    A100_80GB,
    #[serde(rename = "H100-80GB")]
    H100_80GB,
    #[serde(rename = "H100-NVL")]
    H100_NVL,
    #[serde(rename = "H200")]
    H200,
    #[serde(rename = "B200")]
    B200,
    #[serde(rename = "L40S")]
    L40S,
}

impl GpuModel {
    pub const ALL: [GpuModel; 7] = [
        GpuModel::A100_40GB,
        GpuModel::A100_80GB,
        GpuModel::H100_80GB,
        GpuModel::H100_NVL,
        GpuModel::H200,
        GpuModel::B200,
        GpuModel::L40S,
    ];

    /// The name used in fleet files, the database and the UI.
    pub fn name(self) -> &'static str {
        match self {
            GpuModel::A100_40GB => "A100-40GB",
            GpuModel::A100_80GB => "A100-80GB",
            GpuModel::H100_80GB => "H100-80GB",
            GpuModel::H100_NVL => "H100-NVL",
            GpuModel::H200 => "H200",
            GpuModel::B200 => "B200",
            GpuModel::L40S => "L40S",
        }
    }

    pub fn parse(name: &str) -> Option<GpuModel> {
        GpuModel::ALL.into_iter().find(|m| m.name().eq_ignore_ascii_case(name))
    }

    pub fn memory_gb(self) -> u32 {
        match self {
            GpuModel::A100_40GB => 40,
            GpuModel::A100_80GB | GpuModel::H100_80GB => 80,
            GpuModel::H100_NVL => 94,
            GpuModel::H200 => 141,
            GpuModel::B200 => 180,
            GpuModel::L40S => 48,
        }
    }

    /// Whether the model can be split into MIG instances (seven compute slices).
    pub fn mig_capable(self) -> bool {
        !matches!(self, GpuModel::L40S)
    }
}

impl std::fmt::Display for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for model in GpuModel::ALL {
            assert_eq!(GpuModel::parse(model.name()), Some(model));
        }
        assert_eq!(GpuModel::parse("h100-80gb"), Some(GpuModel::H100_80GB));
        assert_eq!(GpuModel::parse("V100"), None);
    }
}
