//! Checking a launch request before anything is written. Shared by the server (which
//! decides) and the browser (which can explain early).

use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::catalog::{Offering, Size};
use crate::gpu::GpuModel;
use crate::image::ImageChoice;
use crate::serving::Serving;

/// What the launch form sends, as typed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRequest {
    pub offering: String,
    pub size: String,
    pub name: String,
    pub hours: String,
    /// Empty for "now", else a UTC date and time (see `booking::parse_start`).
    #[serde(default)]
    pub start: String,
    /// "As soon as possible": a number of days instead of a start. The booking gets the
    /// earliest start at which the size is free for the whole duration, ending within the
    /// booking horizon and starting within this many days; empty to use `start`.
    #[serde(default)]
    pub earliest_within_days: String,
    /// "Any of these models": other GPU models the booking may take instead of the size's
    /// own, as names separated by commas (`A100-80GB,H100-80GB`), or `any` for every model
    /// the offering sells this size on. Each becomes the offering's size of the same kind
    /// on that model (its price and quota); the size asked for is tried first.
    #[serde(default)]
    pub models: String,
    /// "Any model with at least N GB": the size of the same kind on every model whose GPUs
    /// have at least this much memory (narrowing `models` when both are given).
    #[serde(default)]
    pub min_gpu_memory_gb: String,
    /// Empty or `guaranteed`, or `spot`.
    #[serde(default)]
    pub tier: String,
    /// The id of the project whose quota the booking counts against; empty for none.
    #[serde(default)]
    pub project: String,
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub command: String,
    /// An inference endpoint's model, its server's arguments and `NAME=value` lines of
    /// environment variables (see `serving`); empty for other offerings.
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub args: String,
    #[serde(default)]
    pub env: String,
    /// The ids of the volumes to attach besides the owner's home volume (notebooks and
    /// training jobs only): their own personal volumes and the booking's project's.
    #[serde(default, deserialize_with = "ids_as_text")]
    pub volumes: Vec<String>,
}

/// Volume ids as the API sends them (numbers) or as a form does (text).
fn ids_as_text<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        Text(String),
        Number(i64),
    }
    let ids: Vec<Id> = Vec::deserialize(deserializer)?;
    Ok(ids
        .into_iter()
        .map(|id| match id {
            Id::Text(text) => text,
            Id::Number(n) => n.to_string(),
        })
        .collect())
}

/// A launch request that passed every rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    pub offering: Offering,
    pub size: &'static Size,
    pub name: String,
    pub hours: u32,
    pub image: Option<String>,
    pub command: Option<String>,
    /// Book at the earliest start within this many days (see
    /// [`LaunchRequest::earliest_within_days`]).
    pub earliest_within_days: Option<u32>,
    /// Sizes to book instead of `size`, in order, when it does not fit: the same capacity on
    /// the other GPU models the request allows.
    pub alternatives: Vec<&'static Size>,
    /// An inference endpoint's model, arguments and variables (empty for the others).
    pub serving: Serving,
}

/// The most days ahead an "as soon as possible" search may look; the booking horizon
/// bounds it too.
pub const MAX_EARLIEST_DAYS: u32 = 90;

pub const MAX_NAME: usize = 40;
pub const MAX_COMMAND: usize = 2000;

/// Checks a launch request; `images` is what the caller's tenant may run (the platform
/// reads it from the catalog).
pub fn validate(req: &LaunchRequest, images: &ImageChoice) -> Result<LaunchSpec, Refusal> {
    let offering =
        Offering::parse(req.offering.trim()).ok_or_else(|| Refusal::UnknownOffering(req.offering.clone()))?;
    let size = offering
        .size(req.size.trim())
        .ok_or_else(|| Refusal::UnknownSize { offering: offering.title().to_owned(), size: req.size.clone() })?;
    let name = validate_name(req.name.trim())?;
    let hours = parse_hours(offering, &req.hours)?;
    let image = images.choose(offering, &req.image)?;
    let command = req.command.trim();
    let command = if offering.needs_command() {
        if command.is_empty() {
            return Err(Refusal::CommandRequired(offering.title()));
        }
        if command.len() > MAX_COMMAND {
            return Err(Refusal::InvalidCommand("is longer than 2000 characters"));
        }
        if command.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
            return Err(Refusal::InvalidCommand("contains control characters"));
        }
        Some(command.to_owned())
    } else {
        None
    };
    let earliest_within_days = match req.earliest_within_days.trim() {
        "" => None,
        days => {
            if !req.start.trim().is_empty() {
                return Err(Refusal::InvalidEarliestSearch(
                    "give either a start or a number of days to find the earliest start in, not both".into(),
                ));
            }
            let days = days.parse::<u32>().ok().filter(|d| (1..=MAX_EARLIEST_DAYS).contains(d)).ok_or_else(|| {
                Refusal::InvalidEarliestSearch(format!(
                    "\"{days}\" is not a number of days from 1 to {MAX_EARLIEST_DAYS} to find the earliest start in"
                ))
            })?;
            Some(days)
        }
    };
    let alternatives = alternatives(offering, size, &req.models, &req.min_gpu_memory_gb)?;
    let serving = Serving::parse(offering, &req.model, &req.args, &req.env)?;
    Ok(LaunchSpec { offering, size, name, hours, image, command, earliest_within_days, alternatives, serving })
}

/// The sizes of the same kind as `size` on the other models `models` and `min_memory` allow.
fn alternatives(
    offering: Offering,
    size: &'static Size,
    models: &str,
    min_memory: &str,
) -> Result<Vec<&'static Size>, Refusal> {
    let refuse = |what: String| Err(Refusal::InvalidModels(what));
    let same: Vec<&'static Size> = offering.same_size_on_other_models(size).collect();
    let mut out: Vec<&'static Size> = match models.trim() {
        "" if min_memory.trim().is_empty() => return Ok(Vec::new()),
        "" | "any" => same,
        list => {
            let mut out = Vec::new();
            for name in list.split([',', '|']).map(str::trim).filter(|n| !n.is_empty()) {
                let Some(model) = GpuModel::parse(name) else {
                    return refuse(format!("there is no GPU model called \"{name}\""));
                };
                if model == size.gpu_model() {
                    continue;
                }
                match same.iter().find(|s| s.gpu_model() == model) {
                    Some(s) if !out.contains(s) => out.push(*s),
                    Some(_) => {}
                    None => {
                        return refuse(format!("{} has no size like {} on {model}", offering.title(), size.label));
                    }
                }
            }
            out
        }
    };
    if let Some(gb) =
        match min_memory.trim() {
            "" => None,
            text => Some(text.parse::<u32>().ok().filter(|gb| (1..=10_000).contains(gb)).ok_or_else(|| {
                Refusal::InvalidModels(format!("\"{text}\" is not a whole number of GB of GPU memory"))
            })?),
        }
    {
        let own = size.gpu_model().memory_gb();
        if own < gb {
            return refuse(format!("{} has {own} GB GPUs, less than the {gb} GB asked for", size.label));
        }
        out.retain(|s| s.gpu_model().memory_gb() >= gb);
    }
    Ok(out)
}

/// Names become Kubernetes object names later: DNS labels, short enough to add suffixes.
/// The most replicas an inference endpoint may run; each books its size again.
pub const MAX_REPLICAS: u32 = 8;

/// The longest `Idempotency-Key` taken, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 255;

/// An `Idempotency-Key` header's value: 1 to 255 visible ASCII characters (what a UUID, a
/// ULID or a job's own name fits in), so it can be logged and stored as it came.
pub fn check_idempotency_key(key: &str) -> Result<(), Refusal> {
    if key.is_empty() {
        return Err(Refusal::InvalidIdempotencyKey("must not be empty"));
    }
    if key.len() > MAX_IDEMPOTENCY_KEY {
        return Err(Refusal::InvalidIdempotencyKey("must be at most 255 characters"));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Refusal::InvalidIdempotencyKey("may hold only visible ASCII characters, no spaces"));
    }
    Ok(())
}

/// A replica count as the environment page sends it.
pub fn validate_replicas(text: &str) -> Result<u32, Refusal> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_REPLICAS).contains(n))
        .ok_or(Refusal::InvalidReplicas { max: MAX_REPLICAS })
}

fn validate_name(name: &str) -> Result<String, Refusal> {
    if name.is_empty() {
        return Err(Refusal::InvalidName("is required"));
    }
    if name.len() > MAX_NAME {
        return Err(Refusal::InvalidName("must be at most 40 characters"));
    }
    if !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
        return Err(Refusal::InvalidName("may use only lowercase letters, digits and hyphens"));
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) || name.ends_with('-') {
        return Err(Refusal::InvalidName("must start with a letter and not end with a hyphen"));
    }
    Ok(name.to_owned())
}

/// A booking's duration as typed: whole hours, 1 to the offering's longest.
pub fn parse_hours(offering: Offering, text: &str) -> Result<u32, Refusal> {
    let max = offering.max_hours();
    text.trim().parse::<u32>().ok().filter(|h| (1..=max).contains(h)).ok_or(Refusal::InvalidDuration { min: 1, max })
}

/// What an availability question asks (the API's `GET /api/v1/availability`): how many of
/// each size of `offering` fit for `hours` from `start` (`None`: now), and otherwise the
/// earliest start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvailabilityAsk {
    pub offering: Offering,
    pub hours: u32,
    pub start: Option<i64>,
}

impl AvailabilityAsk {
    /// Reads the question as typed: an offering's id, whole hours (empty: 1) and a start as
    /// the launch takes it (empty: now).
    pub fn parse(offering: &str, hours: &str, start: &str) -> Result<AvailabilityAsk, Refusal> {
        let offering = Offering::parse(offering.trim()).ok_or_else(|| Refusal::UnknownOffering(offering.to_owned()))?;
        let hours = if hours.trim().is_empty() { 1 } else { parse_hours(offering, hours)? };
        let start = crate::booking::parse_start(start)?;
        Ok(AvailabilityAsk { offering, hours, start })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_come_as_numbers_or_text() {
        let api: LaunchRequest = serde_json::from_str(
            r#"{"offering": "notebook", "size": "s", "name": "n", "hours": "1", "volumes": [3, "4"]}"#,
        )
        .unwrap();
        assert_eq!(api.volumes, ["3", "4"]);
        let none: LaunchRequest =
            serde_json::from_str(r#"{"offering": "notebook", "size": "s", "name": "n", "hours": "1"}"#).unwrap();
        assert!(none.volumes.is_empty());
    }

    #[test]
    fn replicas_are_a_whole_number_within_the_limit() {
        assert_eq!(validate_replicas(" 3 "), Ok(3));
        assert_eq!(validate_replicas("8"), Ok(MAX_REPLICAS));
        for bad in ["0", "9", "-1", "two", "", "1.5"] {
            assert_eq!(validate_replicas(bad), Err(Refusal::InvalidReplicas { max: MAX_REPLICAS }), "{bad}");
        }
    }

    #[test]
    fn idempotency_keys_are_short_visible_ascii() {
        assert_eq!(check_idempotency_key("0b6f2a9e-5c1d-4f7a-9d1e-2a3b4c5d6e7f"), Ok(()));
        assert_eq!(check_idempotency_key(&"k".repeat(MAX_IDEMPOTENCY_KEY)), Ok(()));
        for bad in ["", "two words", "tab\tkey", "schlüssel"] {
            assert!(check_idempotency_key(bad).is_err(), "{bad:?}");
        }
        assert!(check_idempotency_key(&"k".repeat(MAX_IDEMPOTENCY_KEY + 1)).is_err());
    }

    /// The seeded platform catalog's notebook default, and custom images from anywhere.
    const NOTEBOOK: &str = "quay.io/jupyter/pytorch-notebook:cuda12-latest";

    fn check(req: &LaunchRequest) -> Result<LaunchSpec, Refusal> {
        let notebook = crate::image::CatalogImage {
            id: 1,
            tenant_id: None,
            name: "PyTorch notebook".into(),
            reference: NOTEBOOK.into(),
            description: String::new(),
            cuda: String::new(),
            framework: String::new(),
            offerings: vec![Offering::Notebook],
            default_for: vec![Offering::Notebook],
        };
        let images =
            ImageChoice { tenant: None, catalog: vec![notebook], custom: crate::image::CustomImages::AnyRegistry };
        validate(req, &images)
    }

    fn request(offering: &str, size: &str) -> LaunchRequest {
        LaunchRequest {
            offering: offering.into(),
            size: size.into(),
            name: "my-env".into(),
            hours: "4".into(),
            ..LaunchRequest::default()
        }
    }

    #[test]
    fn other_gpu_models_become_the_same_size_on_them() {
        let ids = |req: LaunchRequest| check(&req).map(|s| s.alternatives.iter().map(|a| a.id).collect::<Vec<_>>());
        let training = |models: &str, gb: &str| LaunchRequest {
            image: "ghcr.io/acme/trainer:1".into(),
            command: "python train.py".into(),
            models: models.into(),
            min_gpu_memory_gb: gb.into(),
            ..request("training", "h100-8")
        };
        assert_eq!(ids(training("", "")), Ok(vec![]));
        assert_eq!(ids(training("A100-80GB", "")), Ok(vec!["a100-8"]));
        assert_eq!(ids(training("h100-80gb, a100-80gb", "")), Ok(vec!["a100-8"]), "its own model is no alternative");
        assert_eq!(ids(training("any", "")), Ok(vec!["a100-8"]));
        assert_eq!(ids(training("", "80")), Ok(vec!["a100-8"]), "every model with 80 GB or more");
        let big =
            LaunchRequest { models: "any".into(), min_gpu_memory_gb: "48".into(), ..request("notebook", "l40s-1") };
        assert_eq!(ids(big), Ok(vec!["h100-1"]), "H100 80GB has 48 GB or more");
        assert_eq!(ids(LaunchRequest { models: "any".into(), ..request("notebook", "l40s-1") }), Ok(vec!["h100-1"]));
        let slice = LaunchRequest { models: "any".into(), ..request("inference", "h100-3g.40gb") };
        let slice = LaunchRequest { image: "ghcr.io/acme/serve:1".into(), ..slice };
        assert_eq!(ids(slice), Ok(vec!["a100-3g.40gb"]), "the same MIG profile");
        let refused = |req: LaunchRequest| check(&req).expect_err("refused").to_string();
        assert!(refused(training("V100", "")).contains("no GPU model called \"V100\""));
        assert!(
            refused(training("L40S", "")).contains("Training job has no size like 8 x H100 80GB, full node on L40S")
        );
        assert!(refused(training("", "141")).contains("has 80 GB GPUs, less than the 141 GB asked for"));
        assert!(refused(training("", "lots")).contains("\"lots\" is not a whole number of GB"));
    }

    #[test]
    fn as_soon_as_possible_is_a_number_of_days() {
        let spec = check(&LaunchRequest { earliest_within_days: " 7 ".into(), ..request("notebook", "l40s-1") });
        assert_eq!(spec.map(|s| s.earliest_within_days), Ok(Some(7)));
        assert_eq!(check(&request("notebook", "l40s-1")).map(|s| s.earliest_within_days), Ok(None));
    }

    #[test]
    fn a_notebook_gets_the_default_image() {
        let spec = check(&request("notebook", "h100-1g.10gb")).expect("valid");
        assert_eq!(spec.image.as_deref(), Some(NOTEBOOK));
        assert_eq!(spec.hours, 4);
        assert_eq!(spec.command, None);
    }

    #[test]
    fn training_needs_image_and_command() {
        let mut req = request("training", "h100-1");
        assert_eq!(check(&req), Err(Refusal::ImageRequired("Training job")));
        req.image = "ghcr.io/acme/trainer:1.2".into();
        assert_eq!(check(&req), Err(Refusal::CommandRequired("Training job")));
        req.command = "python train.py --epochs 3".into();
        assert!(check(&req).is_ok());
    }

    #[test]
    fn every_refusal_says_what_is_wrong() {
        let cases: Vec<(LaunchRequest, &str)> = vec![
            (request("gpu-farm", "x"), "no offering called \"gpu-farm\""),
            (request("notebook", "h100-8"), "Jupyter notebook has no size called \"h100-8\""),
            (LaunchRequest { name: "".into(), ..request("notebook", "l40s-1") }, "name is required"),
            (LaunchRequest { name: "My Env".into(), ..request("notebook", "l40s-1") }, "lowercase"),
            (LaunchRequest { name: "9lives".into(), ..request("notebook", "l40s-1") }, "start with a letter"),
            (LaunchRequest { hours: "0".into(), ..request("notebook", "l40s-1") }, "between 1 and 24"),
            (LaunchRequest { hours: "25".into(), ..request("notebook", "l40s-1") }, "between 1 and 24"),
            (LaunchRequest { hours: "two".into(), ..request("notebook", "l40s-1") }, "whole number"),
            (
                LaunchRequest { image: "evil/miner".into(), ..request("notebook", "l40s-1") },
                "not one of the jupyter notebook images in the catalog",
            ),
            (LaunchRequest { image: "https://x/y".into(), ..request("inference", "l40s-1") }, "not a URL"),
            (
                LaunchRequest { earliest_within_days: "0".into(), ..request("notebook", "l40s-1") },
                "from 1 to 90 to find the earliest start in",
            ),
            (
                LaunchRequest { earliest_within_days: "a week".into(), ..request("notebook", "l40s-1") },
                "\"a week\" is not a number of days",
            ),
            (
                LaunchRequest {
                    earliest_within_days: "3".into(),
                    start: "2026-12-01T09:00".into(),
                    ..request("notebook", "l40s-1")
                },
                "either a start or a number of days",
            ),
        ];
        for (req, expected) in cases {
            let err = check(&req).expect_err(expected).to_string();
            assert!(err.contains(expected), "{err:?} should contain {expected:?}");
        }
    }

    #[test]
    fn an_availability_question_is_read_as_the_launch_reads_it() {
        let ask = AvailabilityAsk::parse("training", "", "").expect("defaults");
        assert_eq!(ask, AvailabilityAsk { offering: Offering::TrainingJob, hours: 1, start: None });
        let ask = AvailabilityAsk::parse(" notebook ", "24", "2026-11-26T14:00").expect("typed");
        assert_eq!((ask.hours, ask.start.is_some()), (24, true));
        assert_eq!(AvailabilityAsk::parse("gpu", "1", ""), Err(Refusal::UnknownOffering("gpu".into())));
        assert_eq!(
            AvailabilityAsk::parse("notebook", "25", ""),
            Err(Refusal::InvalidDuration { min: 1, max: 24 }),
            "a notebook is booked for a day at most"
        );
        assert!(matches!(AvailabilityAsk::parse("notebook", "2", "tomorrow"), Err(Refusal::InvalidStart(_))));
    }
}
