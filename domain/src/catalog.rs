//! The service catalog: what a user can launch, in which sizes (their prices are the rate
//! card's, `rates`).

use serde::{Deserialize, Serialize};

use crate::gpu::GpuModel;
use crate::mig::MigProfile;
use crate::placement::Shape;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Offering {
    Notebook,
    TrainingJob,
    InferenceEndpoint,
    DedicatedCluster,
}

/// What the user must supply besides a size and a duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageRule {
    /// An image of the catalog (`image.rs`): the portal connects to what runs inside.
    CatalogOnly,
    /// An image of the catalog, or one the user names where their tenant allows it.
    CatalogOrCustom,
    /// The offering brings its own software (a dedicated cluster).
    None,
}

impl Offering {
    pub const ALL: [Offering; 4] =
        [Offering::Notebook, Offering::TrainingJob, Offering::InferenceEndpoint, Offering::DedicatedCluster];

    /// The identifier in URLs, forms and the database.
    pub fn id(self) -> &'static str {
        match self {
            Offering::Notebook => "notebook",
            Offering::TrainingJob => "training",
            Offering::InferenceEndpoint => "inference",
            Offering::DedicatedCluster => "cluster",
        }
    }

    pub fn parse(id: &str) -> Option<Offering> {
        Offering::ALL.into_iter().find(|o| o.id() == id)
    }

    pub fn title(self) -> &'static str {
        match self {
            Offering::Notebook => "Jupyter notebook",
            Offering::TrainingJob => "Training job",
            Offering::InferenceEndpoint => "Inference endpoint",
            Offering::DedicatedCluster => "Dedicated cluster",
        }
    }

    pub fn summary(self) -> &'static str {
        match self {
            Offering::Notebook => {
                "JupyterLab with a GPU slice or whole GPUs, your home volume mounted, ready in about a minute."
            }
            Offering::TrainingJob => {
                "Run your container image and command on dedicated GPUs; logs and exit status in the portal."
            }
            Offering::InferenceEndpoint => "Serve a model image behind an HTTPS URL with an API key.",
            Offering::DedicatedCluster => {
                "Whole nodes with NVLink, reserved for your team, with a kubeconfig limited to them."
            }
        }
    }

    pub fn image_rule(self) -> ImageRule {
        match self {
            Offering::Notebook => ImageRule::CatalogOnly,
            Offering::TrainingJob | Offering::InferenceEndpoint => ImageRule::CatalogOrCustom,
            Offering::DedicatedCluster => ImageRule::None,
        }
    }

    pub fn needs_command(self) -> bool {
        matches!(self, Offering::TrainingJob)
    }

    /// Longest booking a user may ask for, in hours.
    pub fn max_hours(self) -> u32 {
        match self {
            Offering::Notebook => 24,
            Offering::TrainingJob => 72,
            Offering::InferenceEndpoint => 168,
            Offering::DedicatedCluster => 336,
        }
    }

    pub fn sizes(self) -> &'static [Size] {
        match self {
            Offering::Notebook => NOTEBOOK_SIZES,
            Offering::TrainingJob => TRAINING_SIZES,
            Offering::InferenceEndpoint => INFERENCE_SIZES,
            Offering::DedicatedCluster => CLUSTER_SIZES,
        }
    }

    pub fn size(self, id: &str) -> Option<&'static Size> {
        self.sizes().iter().find(|s| s.id == id)
    }

    /// The other sizes of the offering that ask for the same capacity as `size` on another
    /// GPU model ("8 x A100 80GB" for "8 x H100 80GB"), in catalog order.
    pub fn same_size_on_other_models(self, size: &Size) -> impl Iterator<Item = &'static Size> + '_ {
        let (id, shape) = (size.id, size.shape);
        self.sizes().iter().filter(move |s| s.id != id && s.shape.same_kind(shape))
    }
}

/// One orderable size of an offering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub id: &'static str,
    pub label: &'static str,
    pub shape: Shape,
    pub vcpus: u32,
    pub memory_gb: u32,
}

impl Size {
    pub fn gpu_model(&self) -> GpuModel {
        self.shape.model()
    }
}

pub fn format_cents(cents: u32) -> String {
    format!("${}.{:02}", cents / 100, cents % 100)
}

const fn slice(
    id: &'static str,
    label: &'static str,
    model: GpuModel,
    profile: MigProfile,
    vcpus: u32,
    memory_gb: u32,
) -> Size {
    Size { id, label, shape: Shape::MigSlice { model, profile }, vcpus, memory_gb }
}

const fn gpus(id: &'static str, label: &'static str, model: GpuModel, count: u32, vcpus: u32, memory_gb: u32) -> Size {
    Size { id, label, shape: Shape::Gpus { model, count }, vcpus, memory_gb }
}

/// The development tier: a share of a time-sliced GPU.
const fn share(id: &'static str, label: &'static str, model: GpuModel, ways: u8, vcpus: u32, memory_gb: u32) -> Size {
    Size { id, label, shape: Shape::Share { model, ways }, vcpus, memory_gb }
}

/// vCPUs of one GPU node as the catalog sells it whole (a dedicated cluster's node).
pub const NODE_VCPUS: u32 = 192;
/// Memory (GB) of one GPU node as the catalog sells it whole.
pub const NODE_MEMORY_GB: u32 = 2048;

const fn nodes(id: &'static str, label: &'static str, model: GpuModel, count: u32) -> Size {
    Size {
        id,
        label,
        shape: Shape::Nodes { model, count },
        vcpus: NODE_VCPUS * count,
        memory_gb: NODE_MEMORY_GB * count,
    }
}

const NOTEBOOK_SIZES: &[Size] = &[
    slice("h100-1g.10gb", "H100 slice 1g.10gb", GpuModel::H100_80GB, MigProfile::G1, 4, 32),
    slice("h100-3g.40gb", "H100 slice 3g.40gb", GpuModel::H100_80GB, MigProfile::G3, 12, 96),
    gpus("l40s-1", "1 x L40S 48GB", GpuModel::L40S, 1, 16, 128),
    gpus("h100-1", "1 x H100 80GB", GpuModel::H100_80GB, 1, 24, 224),
    share("l40s-dev", "L40S shared by 4 (development)", GpuModel::L40S, 4, 4, 32),
];

const TRAINING_SIZES: &[Size] = &[
    gpus("h100-1", "1 x H100 80GB", GpuModel::H100_80GB, 1, 24, 224),
    gpus("h100-4", "4 x H100 80GB, NVLink", GpuModel::H100_80GB, 4, 96, 900),
    gpus("h100-8", "8 x H100 80GB, full node", GpuModel::H100_80GB, 8, 192, 1800),
    gpus("a100-8", "8 x A100 80GB, full node", GpuModel::A100_80GB, 8, 128, 1000),
];

const INFERENCE_SIZES: &[Size] = &[
    slice("h100-1g.10gb", "H100 slice 1g.10gb", GpuModel::H100_80GB, MigProfile::G1, 4, 32),
    slice("h100-3g.40gb", "H100 slice 3g.40gb", GpuModel::H100_80GB, MigProfile::G3, 12, 96),
    slice("a100-3g.40gb", "A100 slice 3g.40gb", GpuModel::A100_80GB, MigProfile::G3, 12, 96),
    gpus("l40s-1", "1 x L40S 48GB", GpuModel::L40S, 1, 16, 128),
    gpus("h100-1", "1 x H100 80GB", GpuModel::H100_80GB, 1, 24, 224),
];

const CLUSTER_SIZES: &[Size] = &[
    nodes("h100-node-1", "1 node, 8 x H100 80GB, NVLink", GpuModel::H100_80GB, 1),
    nodes("h100-node-2", "2 nodes, 16 x H100 80GB, NVLink", GpuModel::H100_80GB, 2),
    nodes("a100-node-1", "1 node, 8 x A100 80GB", GpuModel::A100_80GB, 1),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_offering_has_sizes_with_unique_ids() {
        for offering in Offering::ALL {
            let sizes = offering.sizes();
            assert!(!sizes.is_empty());
            for (i, s) in sizes.iter().enumerate() {
                assert!(sizes[i + 1..].iter().all(|t| t.id != s.id), "duplicate {}", s.id);
                assert_eq!(offering.size(s.id), Some(s));
            }
            assert_eq!(Offering::parse(offering.id()), Some(offering));
        }
    }

    #[test]
    fn slice_labels_match_the_mig_profile_names() {
        for offering in Offering::ALL {
            for s in offering.sizes() {
                if let Shape::MigSlice { model, profile } = s.shape {
                    let name = profile.name(model).expect("MIG-capable model");
                    assert!(s.label.ends_with(&name), "{} vs {name}", s.label);
                }
            }
        }
    }

    #[test]
    fn shares_split_a_gpu_in_a_way_its_slice_positions_allow() {
        for offering in Offering::ALL {
            for s in offering.sizes() {
                if let Shape::Share { ways, .. } = s.shape {
                    assert!(crate::placement::TIME_SLICE_WAYS.contains(&ways), "{}", s.id);
                    assert!(s.label.contains(&format!("shared by {ways}")), "{}", s.label);
                }
            }
        }
    }

    #[test]
    fn prices_read_as_dollars() {
        assert_eq!(format_cents(320), "$3.20");
        assert_eq!(format_cents(55), "$0.55");
        assert_eq!(format_cents(4800), "$48.00");
    }
}
