//! The image catalog: which container images an environment may run.
//!
//! Platform admins keep the platform's catalog; a tenant admin adds the tenant's own
//! entries. An entry names its image pinned by digest, so every booking of it runs the same
//! bytes. Notebooks run catalog images only (the portal connects to Jupyter inside them);
//! training jobs and endpoints may also name an image of their own where the tenant allows
//! custom images, and only from the registries it lists.

use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::catalog::{ImageRule, Offering};

pub const MAX_NAME: usize = 60;
pub const MAX_DESCRIPTION: usize = 500;
pub const MAX_VERSION: usize = 40;
pub const MAX_REFERENCE: usize = 255;

/// One entry of the catalog, as every page and the launch read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogImage {
    pub id: i64,
    /// `None` for the platform's catalog.
    pub tenant_id: Option<i64>,
    pub name: String,
    pub reference: String,
    pub description: String,
    /// The CUDA version inside, as its maker writes it ("12.4"); empty when it has none.
    pub cuda: String,
    /// Frameworks and their versions ("PyTorch 2.4").
    pub framework: String,
    pub offerings: Vec<Offering>,
    /// The offerings for which this entry is its scope's default.
    pub default_for: Vec<Offering>,
}

impl CatalogImage {
    pub fn suits(&self, offering: Offering) -> bool {
        self.offerings.contains(&offering)
    }

    /// Whether the reference names its bytes (a digest) rather than a tag that may move.
    pub fn is_pinned(&self) -> bool {
        ImageRef::parse(&self.reference).is_ok_and(|r| r.digest.is_some())
    }
}

/// An OCI image reference split as registries read it: `[registry/]repository[:tag][@digest]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef<'a> {
    /// The host (and port) it is pulled from; `docker.io` when the reference names none.
    pub registry: &'a str,
    pub repository: &'a str,
    pub tag: Option<&'a str>,
    /// `sha256:<64 hex>`.
    pub digest: Option<&'a str>,
}

impl<'a> ImageRef<'a> {
    pub fn parse(text: &'a str) -> Result<ImageRef<'a>, Refusal> {
        if text.len() > MAX_REFERENCE {
            return Err(Refusal::InvalidImage("is longer than 255 characters"));
        }
        if text.contains("://") {
            return Err(Refusal::InvalidImage("is a reference like ghcr.io/org/model:tag, not a URL"));
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || "./-_:@".contains(c);
        if !text.chars().all(allowed) || text.starts_with(['.', '-', '/', ':', '@']) {
            return Err(Refusal::InvalidImage("may use only letters, digits and . / - _ : @"));
        }
        let (name, digest) = match text.split_once('@') {
            None => (text, None),
            Some((name, digest)) => {
                let hex = digest.strip_prefix("sha256:").unwrap_or_default();
                if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)) {
                    return Err(Refusal::InvalidImage("has a digest that is not sha256: and 64 lowercase hex digits"));
                }
                (name, Some(digest))
            }
        };
        // A registry is named by a first part with a dot or a port, or `localhost`
        // (Docker's rule); anything else is a path on Docker Hub.
        let (registry, path) = match name.split_once('/') {
            Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => (first, rest),
            _ => ("docker.io", name),
        };
        // A tag follows the last colon after the last slash (a registry's port is not one).
        let last = path.rsplit('/').next().unwrap_or(path);
        let (repository, tag) = match last.rsplit_once(':') {
            Some((_, tag)) => (&path[..path.len() - tag.len() - 1], Some(tag)),
            None => (path, None),
        };
        if repository.is_empty() || repository.split('/').any(str::is_empty) || tag == Some("") {
            return Err(Refusal::InvalidImage("is not a reference like ghcr.io/org/model:tag"));
        }
        Ok(ImageRef { registry, repository, tag, digest })
    }
}

/// Which images besides the catalog's a tenant's people may run (training jobs and
/// endpoints; notebooks run catalog images only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CustomImages {
    CatalogOnly,
    AnyRegistry,
    /// Registry hosts, lowercase.
    Registries(Vec<String>),
}

impl CustomImages {
    /// As kept in `tenants.custom_images`: `catalog`, `*`, or hosts separated by spaces.
    pub fn stored(&self) -> String {
        match self {
            CustomImages::CatalogOnly => "catalog".into(),
            CustomImages::AnyRegistry => "*".into(),
            CustomImages::Registries(hosts) => hosts.join(" "),
        }
    }

    pub fn from_stored(text: &str) -> CustomImages {
        match text.trim() {
            "*" => CustomImages::AnyRegistry,
            "catalog" | "" => CustomImages::CatalogOnly,
            hosts => CustomImages::Registries(hosts.split_whitespace().map(str::to_owned).collect()),
        }
    }

    /// What an admin's form sends: `mode` is `catalog`, `any` or `registries`, and
    /// `registries` the hosts (separated by commas, spaces or lines) for the last.
    pub fn parse(mode: &str, registries: &str) -> Result<CustomImages, Refusal> {
        match mode.trim() {
            "catalog" => Ok(CustomImages::CatalogOnly),
            "any" => Ok(CustomImages::AnyRegistry),
            "registries" => {
                let mut hosts = Vec::new();
                for host in registries.split([',', ' ', '\n', '\r', '\t']).filter(|h| !h.is_empty()) {
                    let host = host.to_ascii_lowercase();
                    let valid = host.len() <= 253
                        && !host.starts_with(['.', '-', ':'])
                        && host.chars().all(|c| c.is_ascii_alphanumeric() || ".-:".contains(c))
                        && (host.contains(['.', ':']) || host == "localhost");
                    if !valid {
                        return Err(Refusal::InvalidImagePolicy(format!(
                            "\"{host}\" is not a registry host like ghcr.io or registry.example.com:5000"
                        )));
                    }
                    if !hosts.contains(&host) {
                        hosts.push(host);
                    }
                }
                if hosts.is_empty() {
                    return Err(Refusal::InvalidImagePolicy(
                        "name at least one registry, or choose \"only the catalog\"".into(),
                    ));
                }
                Ok(CustomImages::Registries(hosts))
            }
            other => Err(Refusal::InvalidImagePolicy(format!(
                "\"{other}\" is not a choice; choose catalog, any or registries"
            ))),
        }
    }

    /// In words, for pages: "only catalog images", "any registry", "ghcr.io and nvcr.io".
    pub fn describe(&self) -> String {
        match self {
            CustomImages::CatalogOnly => "only catalog images".into(),
            CustomImages::AnyRegistry => "images from any registry".into(),
            CustomImages::Registries(hosts) => format!("images from {}", hosts.join(", ")),
        }
    }

    fn allows(&self, registry: &str) -> bool {
        match self {
            CustomImages::CatalogOnly => false,
            CustomImages::AnyRegistry => true,
            CustomImages::Registries(hosts) => hosts.iter().any(|h| h.eq_ignore_ascii_case(registry)),
        }
    }
}

/// What a launch may run: the catalog entries its tenant sees (the tenant's own, then the
/// platform's) and the tenant's custom-image rule (any registry for platform staff).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageChoice {
    pub tenant: Option<String>,
    pub catalog: Vec<CatalogImage>,
    pub custom: CustomImages,
}

impl ImageChoice {
    /// The entries that suit `offering`, the default first.
    pub fn offered(&self, offering: Offering) -> Vec<&CatalogImage> {
        let mut offered: Vec<&CatalogImage> = self.catalog.iter().filter(|i| i.suits(offering)).collect();
        if let Some(default) = self.default_for(offering) {
            offered.retain(|i| i.id != default.id);
            offered.insert(0, default);
        }
        offered
    }

    /// The tenant's default for the offering, else the platform's.
    pub fn default_for(&self, offering: Offering) -> Option<&CatalogImage> {
        let defaults = || self.catalog.iter().filter(|i| i.suits(offering) && i.default_for.contains(&offering));
        defaults().find(|i| i.tenant_id.is_some()).or_else(|| defaults().next())
    }

    /// Whether a launch of `offering` may name an image outside the catalog.
    pub fn custom_allowed(&self, offering: Offering) -> Option<&CustomImages> {
        (offering.image_rule() == ImageRule::CatalogOrCustom && self.custom != CustomImages::CatalogOnly)
            .then_some(&self.custom)
    }

    /// The image a launch runs: none for an offering that brings its own software; the
    /// default entry when none is asked for; a catalog entry named by its reference or
    /// name; else an image of the user's own where the tenant allows it.
    pub fn choose(&self, offering: Offering, asked: &str) -> Result<Option<String>, Refusal> {
        let rule = offering.image_rule();
        if rule == ImageRule::None {
            return Ok(None);
        }
        let asked = asked.trim();
        let offered = self.offered(offering);
        if asked.is_empty() {
            return match offered.first() {
                Some(image) => Ok(Some(image.reference.clone())),
                None if rule == ImageRule::CatalogOnly => Err(Refusal::NoCatalogImage(offering.title())),
                None => Err(Refusal::ImageRequired(offering.title())),
            };
        }
        if let Some(image) = offered.iter().find(|i| i.reference == asked || i.name == asked) {
            return Ok(Some(image.reference.clone()));
        }
        let reference = ImageRef::parse(asked)?;
        if rule == ImageRule::CatalogOnly {
            return Err(Refusal::ImageNotInCatalog(format!(
                "{asked} is not one of the {} images in the catalog",
                offering.title().to_lowercase()
            )));
        }
        if self.custom.allows(reference.registry) {
            return Ok(Some(asked.to_owned()));
        }
        let tenant = self.tenant.as_deref().unwrap_or("this tenant");
        Err(Refusal::ImageNotInCatalog(match &self.custom {
            CustomImages::Registries(hosts) => format!(
                "{asked} comes from {}, which tenant {tenant} does not allow; pick a catalog image or one from {}",
                reference.registry,
                hosts.join(", ")
            ),
            _ => format!("{asked} is not in the image catalog, and tenant {tenant} runs only catalog images"),
        }))
    }
}

/// What the catalog form sends, as typed. `offerings` and `default_for` hold offering ids.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageForm {
    pub name: String,
    pub reference: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub cuda: String,
    #[serde(default)]
    pub framework: String,
    #[serde(default)]
    pub offerings: Vec<String>,
    #[serde(default)]
    pub default_for: Vec<String>,
}

/// A catalog entry that passed every rule, ready to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewImage {
    pub name: String,
    pub reference: String,
    pub description: String,
    pub cuda: String,
    pub framework: String,
    pub offerings: Vec<Offering>,
    pub default_for: Vec<Offering>,
}

/// Checks a new catalog entry: a name, a reference pinned by digest, at least one offering
/// that runs an image, and defaults only among its offerings.
pub fn validate(form: &ImageForm) -> Result<NewImage, Refusal> {
    let name = form.name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(Refusal::InvalidCatalogImage(format!("name must be 1 to {MAX_NAME} characters on one line")));
    }
    let reference = form.reference.trim();
    if ImageRef::parse(reference)?.digest.is_none() {
        return Err(Refusal::InvalidCatalogImage(format!(
            "{reference} is not pinned: add its digest (…@sha256:<64 hex>), so every booking runs the same image"
        )));
    }
    let description = form.description.trim();
    if description.chars().count() > MAX_DESCRIPTION {
        return Err(Refusal::InvalidCatalogImage(format!("description must be at most {MAX_DESCRIPTION} characters")));
    }
    let (cuda, framework) = (form.cuda.trim(), form.framework.trim());
    if [cuda, framework].iter().any(|v| v.chars().count() > MAX_VERSION || v.chars().any(char::is_control)) {
        return Err(Refusal::InvalidCatalogImage(format!(
            "CUDA and framework versions must be at most {MAX_VERSION} characters on one line"
        )));
    }
    let offerings = parse_offerings(&form.offerings)?;
    if offerings.is_empty() {
        return Err(Refusal::InvalidCatalogImage("choose at least one offering the image suits".into()));
    }
    let default_for = parse_offerings(&form.default_for)?;
    if let Some(other) = default_for.iter().find(|o| !offerings.contains(o)) {
        return Err(Refusal::InvalidCatalogImage(format!(
            "it can be the default only for offerings it suits, not for {}",
            other.title().to_lowercase()
        )));
    }
    Ok(NewImage {
        name: name.to_owned(),
        reference: reference.to_owned(),
        description: description.to_owned(),
        cuda: cuda.to_owned(),
        framework: framework.to_owned(),
        offerings,
        default_for,
    })
}

/// Offering ids to offerings that run an image, each once, in catalog order.
fn parse_offerings(ids: &[String]) -> Result<Vec<Offering>, Refusal> {
    let mut offerings = Vec::new();
    for id in ids.iter().map(|i| i.trim()).filter(|i| !i.is_empty()) {
        let offering = Offering::parse(id).ok_or_else(|| Refusal::UnknownOffering(id.to_owned()))?;
        if offering.image_rule() == ImageRule::None {
            return Err(Refusal::InvalidCatalogImage(format!("{} runs no image", offering.title().to_lowercase())));
        }
        offerings.push(offering);
    }
    Ok(Offering::ALL.into_iter().filter(|o| offerings.contains(o)).collect())
}

/// Offerings as stored: their ids separated by commas.
pub fn offerings_stored(offerings: &[Offering]) -> String {
    offerings.iter().map(|o| o.id()).collect::<Vec<_>>().join(",")
}

pub fn offerings_from_stored(text: &str) -> Vec<Offering> {
    text.split(',').filter_map(|id| Offering::parse(id.trim())).collect()
}

/// How a backend should fetch an image: a digest names bytes that never change, so a copy
/// on the node is as good as the registry's; a tag may have moved since the last pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    IfNotPresent,
    Always,
}

impl PullPolicy {
    pub fn of(reference: &str) -> PullPolicy {
        if reference.contains("@sha256:") { PullPolicy::IfNotPresent } else { PullPolicy::Always }
    }

    /// Kubernetes' `imagePullPolicy`.
    pub fn kubernetes(self) -> &'static str {
        match self {
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Always => "Always",
        }
    }

    /// `docker run --pull` / `podman run --pull`.
    pub fn container_cli(self) -> &'static str {
        match self {
            PullPolicy::IfNotPresent => "missing",
            PullPolicy::Always => "always",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn entry(
        id: i64,
        tenant_id: Option<i64>,
        name: &str,
        offerings: &[Offering],
        default_for: &[Offering],
    ) -> CatalogImage {
        CatalogImage {
            id,
            tenant_id,
            name: name.into(),
            reference: format!("ghcr.io/acme/{name}@{DIGEST}"),
            description: String::new(),
            cuda: "12.4".into(),
            framework: String::new(),
            offerings: offerings.to_vec(),
            default_for: default_for.to_vec(),
        }
    }

    fn choice(custom: CustomImages) -> ImageChoice {
        ImageChoice {
            tenant: Some("acme".into()),
            catalog: vec![
                entry(1, None, "jupyter", &[Offering::Notebook], &[Offering::Notebook]),
                entry(2, None, "pytorch", &[Offering::Notebook, Offering::TrainingJob], &[Offering::TrainingJob]),
                entry(3, Some(7), "acme-lab", &[Offering::Notebook], &[Offering::Notebook]),
            ],
            custom,
        }
    }

    #[test]
    fn references_split_as_registries_read_them() {
        let r = ImageRef::parse("ghcr.io/acme/train:1.2").unwrap();
        assert_eq!((r.registry, r.repository, r.tag, r.digest), ("ghcr.io", "acme/train", Some("1.2"), None));
        let r = ImageRef::parse("registry.local:5000/team/img").unwrap();
        assert_eq!((r.registry, r.repository, r.tag), ("registry.local:5000", "team/img", None));
        let r = ImageRef::parse("pytorch/pytorch:2.4").unwrap();
        assert_eq!((r.registry, r.repository), ("docker.io", "pytorch/pytorch"));
        assert_eq!(ImageRef::parse("ubuntu").unwrap().registry, "docker.io");
        assert_eq!(ImageRef::parse("localhost/x:1").unwrap().registry, "localhost");
        let pinned = format!("nvcr.io/nvidia/pytorch:24.05-py3@{DIGEST}");
        let r = ImageRef::parse(&pinned).unwrap();
        assert_eq!((r.tag, r.digest), (Some("24.05-py3"), Some(DIGEST)));
        for bad in ["https://ghcr.io/x", "ghcr.io/x y", "ghcr.io//x", "ghcr.io/x:", "x@sha256:abc", "x@md5:00", "-x"] {
            assert!(ImageRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_default_comes_first_and_the_tenants_wins() {
        let c = choice(CustomImages::AnyRegistry);
        let names: Vec<&str> = c.offered(Offering::Notebook).iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["acme-lab", "jupyter", "pytorch"]);
        assert_eq!(c.choose(Offering::Notebook, "").unwrap().unwrap(), c.catalog[2].reference);
        assert_eq!(c.choose(Offering::TrainingJob, "").unwrap().unwrap(), c.catalog[1].reference);
        assert_eq!(c.choose(Offering::Notebook, "jupyter").unwrap().unwrap(), c.catalog[0].reference);
        assert_eq!(c.choose(Offering::DedicatedCluster, "anything").unwrap(), None);
    }

    #[test]
    fn notebooks_run_catalog_images_only() {
        let c = choice(CustomImages::AnyRegistry);
        let refusal = c.choose(Offering::Notebook, "evil/miner").unwrap_err().to_string();
        assert!(refusal.contains("not one of the jupyter notebook images in the catalog"), "{refusal}");
        let empty = ImageChoice { catalog: vec![], ..c };
        assert!(empty.choose(Offering::Notebook, "").unwrap_err().to_string().contains("no jupyter notebook image"));
        assert_eq!(empty.custom_allowed(Offering::Notebook), None);
    }

    #[test]
    fn custom_images_follow_the_tenants_rule() {
        let any = choice(CustomImages::AnyRegistry);
        assert_eq!(any.choose(Offering::TrainingJob, "docker.io/x/y:1").unwrap().as_deref(), Some("docker.io/x/y:1"));
        assert!(
            any.choose(Offering::InferenceEndpoint, "").unwrap_err().to_string().contains("needs a container image")
        );

        let listed = choice(CustomImages::parse("registries", "GHCR.io, nvcr.io\nghcr.io").unwrap());
        assert_eq!(listed.custom, CustomImages::Registries(vec!["ghcr.io".into(), "nvcr.io".into()]));
        assert!(listed.choose(Offering::TrainingJob, "nvcr.io/nvidia/pytorch:24.05-py3").is_ok());
        let refusal = listed.choose(Offering::TrainingJob, "pytorch/pytorch:2.4").unwrap_err().to_string();
        assert_eq!(
            refusal,
            "container image pytorch/pytorch:2.4 comes from docker.io, which tenant acme does not allow; \
             pick a catalog image or one from ghcr.io, nvcr.io"
        );

        let catalog_only = choice(CustomImages::CatalogOnly);
        let refusal = catalog_only.choose(Offering::TrainingJob, "ghcr.io/x/y:1").unwrap_err().to_string();
        assert!(refusal.contains("tenant acme runs only catalog images"), "{refusal}");
        assert!(catalog_only.choose(Offering::TrainingJob, "pytorch").is_ok(), "the catalog still is");
    }

    #[test]
    fn the_rule_is_stored_and_read_back() {
        for custom in [
            CustomImages::CatalogOnly,
            CustomImages::AnyRegistry,
            CustomImages::Registries(vec!["ghcr.io".into(), "registry.local:5000".into()]),
        ] {
            assert_eq!(CustomImages::from_stored(&custom.stored()), custom);
        }
        assert!(CustomImages::parse("registries", "").is_err());
        assert!(CustomImages::parse("registries", "not a host!").is_err());
        assert!(CustomImages::parse("registries", "ubuntu").is_err(), "a bare word is a Docker Hub path");
        assert!(CustomImages::parse("everything", "").is_err());
    }

    #[test]
    fn an_entry_must_be_pinned_and_suit_an_offering() {
        let form = ImageForm {
            name: "PyTorch 2.4".into(),
            reference: format!("nvcr.io/nvidia/pytorch:24.05-py3@{DIGEST}"),
            cuda: "12.4".into(),
            offerings: vec!["training".into(), "notebook".into()],
            default_for: vec!["training".into()],
            ..ImageForm::default()
        };
        let entry = validate(&form).unwrap();
        assert_eq!(entry.offerings, [Offering::Notebook, Offering::TrainingJob]);
        assert_eq!(offerings_from_stored(&offerings_stored(&entry.offerings)), entry.offerings);

        let unpinned = ImageForm { reference: "nvcr.io/nvidia/pytorch:24.05-py3".into(), ..form.clone() };
        assert!(validate(&unpinned).unwrap_err().to_string().contains("is not pinned"));
        let none = ImageForm { offerings: vec![], default_for: vec![], ..form.clone() };
        assert!(validate(&none).unwrap_err().to_string().contains("at least one offering"));
        let cluster = ImageForm { offerings: vec!["cluster".into()], default_for: vec![], ..form.clone() };
        assert!(validate(&cluster).unwrap_err().to_string().contains("runs no image"));
        let stray = ImageForm { default_for: vec!["inference".into()], ..form.clone() };
        assert!(validate(&stray).unwrap_err().to_string().contains("only for offerings it suits"));
        let nameless = ImageForm { name: " ".into(), ..form };
        assert!(validate(&nameless).is_err());
    }

    #[test]
    fn a_digest_is_pulled_once_a_tag_every_time() {
        assert_eq!(PullPolicy::of(&format!("x@{DIGEST}")), PullPolicy::IfNotPresent);
        assert_eq!(PullPolicy::of("x:latest").kubernetes(), "Always");
        assert_eq!(PullPolicy::of("x:1").container_cli(), "always");
    }
}
