use thiserror::Error;

/// Every way Berth's rules can say no, in words a user can act on.
///
/// This is the domain layer's one error type: the platform wraps it, the UI shows its
/// `Display` text as it is.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refusal {
    #[error("there is no offering called \"{0}\"")]
    UnknownOffering(String),
    #[error("a node that is {} cannot {}", state.to_lowercase(), event.replace('_', " "))]
    NodeTransition { state: &'static str, event: &'static str },
    #[error("{0}")]
    InvalidCheckOutput(String),
    #[error("there is no check level \"{0}\"; choose quick, medium or long")]
    InvalidCheckLevel(String),
    #[error("this Berth's backend cannot run node checks or repairs yet")]
    NodeChecksUnsupported,
    #[error("node {0} is held by a booking; checks that disturb it wait until it is free")]
    NodeHeld(String),
    #[error("checks are running on {node} already (check run {run}); wait for them to finish")]
    ChecksRunning { node: String, run: i64 },
    #[error("{node} has GPUs 0 to {}; there is no GPU {gpu}", gpus.saturating_sub(1))]
    NoSuchGpu { node: String, gpu: u32, gpus: u32 },
    #[error("GPU {gpu} of {node} holds a booking now or within 10 minutes; reset it when nothing runs on it")]
    GpuInUse { node: String, gpu: u32 },
    #[error("Berth does not reset GPUs on the {0} backend")]
    GpuResetUnsupported(&'static str),
    #[error("GPU {gpu} of {node} was not reset: {why}")]
    GpuResetFailed { node: String, gpu: u32, why: String },
    #[error("{offering} has no size called \"{size}\"")]
    UnknownSize { offering: String, size: String },
    #[error("name {0}")]
    InvalidName(&'static str),
    #[error("duration must be a whole number of hours between {min} and {max}")]
    InvalidDuration { min: u32, max: u32 },
    #[error("{0} needs a container image")]
    ImageRequired(&'static str),
    #[error("container image {0}")]
    InvalidImage(&'static str),
    #[error("there is no {} image in the catalog yet; a platform admin adds them under Images", .0.to_lowercase())]
    NoCatalogImage(&'static str),
    /// An image the catalog does not list and the tenant's rule does not allow.
    #[error("container image {0}")]
    ImageNotInCatalog(String),
    #[error("custom images: {0}")]
    InvalidImagePolicy(String),
    #[error("catalog image: {0}")]
    InvalidCatalogImage(String),
    #[error("there is no catalog image {0}")]
    UnknownCatalogImage(i64),
    #[error("{0} needs a command to run")]
    CommandRequired(&'static str),
    #[error("command {0}")]
    InvalidCommand(&'static str),
    #[error("you already have an active environment called \"{0}\"; pick another name")]
    NameInUse(String),
    /// `when` is "right now" or the asked window; `hint` says what would fit instead.
    #[error("no capacity for {size} {when}: {detail}{hint}")]
    NoCapacity { size: String, when: String, detail: String, hint: String },
    #[error("this environment is already {0}; there is nothing to stop")]
    NotStoppable(&'static str),
    #[error("start {0}")]
    InvalidStart(String),
    #[error("end {0}")]
    InvalidEnd(String),
    /// GPU models a launch may also take that do not make sense for its size.
    #[error("GPU models: {0}")]
    InvalidModels(String),
    /// An "as soon as possible" request that cannot be searched as asked.
    #[error("as soon as possible: {0}")]
    InvalidEarliestSearch(String),
    #[error("the start is in the past; leave it empty to start now")]
    StartInPast,
    #[error("bookings may end at most {days} days from now")]
    BeyondHorizon { days: i64 },
    #[error("the new end must be after the start and after now")]
    EndNotAfterStart,
    #[error("this offering may be booked for at most {max_hours} hours")]
    TooLong { max_hours: u32 },
    #[error("quota: {0}")]
    QuotaExceeded(String),
    /// A booking whose cost would take a project or tenant past its monthly budget.
    #[error("budget: {0}")]
    OverBudget(String),
    #[error("budget: {0}")]
    InvalidBudget(String),
    /// A rate card change that cannot be made (a price, a discount, a date).
    #[error("prices: {0}")]
    InvalidPrice(String),
    /// A size whose line of the rate card has no price in force.
    #[error("{0} has no price on the rate card yet; a platform admin sets one under Prices")]
    Unpriced(String),
    /// A usage report asked for in a way it cannot be made (a month that is not one).
    #[error("usage report: {0}")]
    InvalidUsageReport(String),
    /// A listing's filter that names nothing it can filter by (`state=sleeping`, `owner=bob`).
    #[error("filter: {0}")]
    InvalidListFilter(String),
    /// A listing's page that is not one: a limit out of range, a cursor it did not give.
    #[error("{0}")]
    InvalidPage(String),
    /// A tenant webhook that cannot be saved: its URL, format or kinds.
    #[error("webhook: {0}")]
    InvalidWebhook(String),
    #[error("notifications: {0}")]
    InvalidNotificationChoice(String),
    #[error("this environment is {0}; only booked or running environments can change their end")]
    NotResizable(&'static str),
    #[error("there is no node called \"{0}\"")]
    UnknownNode(String),
    #[error("there is no user with the email \"{0}\"")]
    UnknownUser(String),
    #[error("short name {0}")]
    InvalidSlug(&'static str),
    #[error("the short name \"{0}\" is taken")]
    SlugInUse(String),
    #[error("isolation must be soft, hard or hybrid, not \"{0}\"")]
    InvalidIsolation(String),
    #[error("a tenant's status can be set to active or suspended, not \"{0}\" (delete a tenant with DELETE)")]
    InvalidTenantStatus(String),
    #[error("the tenant cannot become {isolation} yet: {detail}")]
    IsolationBlocked { isolation: &'static str, detail: String },
    #[error("there is no role called \"{0}\"")]
    InvalidRole(String),
    #[error("a tenant's members can be tenant admins, members or viewers, not {0}")]
    NotATenantRole(&'static str),
    #[error("\"{0}\" is not an email address")]
    InvalidEmail(String),
    #[error("{0} already has an account")]
    EmailInUse(String),
    #[error("you cannot change or remove your own membership; ask another tenant admin")]
    OwnMembership,
    #[error("a tenant needs at least one tenant admin")]
    LastTenantAdmin,
    #[error("the tenant is {0}")]
    TenantNotActive(&'static str),
    #[error("issuer must be an https URL without a query, not \"{0}\"")]
    InvalidIssuer(String),
    #[error(
        "the identity provider's host {0} is a loopback, link-local or private address; Berth reaches only public providers unless its operator starts it with --allow-private-issuers"
    )]
    PrivateIssuer(String),
    #[error("{0}")]
    InvalidSso(&'static str),
    #[error("token {0}")]
    InvalidToken(String),
    #[error("too many failed sign-ins; wait {minutes} minutes and try again")]
    TooManyAttempts { minutes: i64 },
    #[error("that code is not right (or was used already); enter the current one from your authenticator app")]
    WrongCode,
    #[error("the new password {0}")]
    WeakPassword(&'static str),
    #[error("the new password must differ from the one you have")]
    SamePassword,
    #[error("the current password is not right")]
    WrongPassword,
    #[error("{0}")]
    NotALocalAccount(&'static str),
    #[error("the page to go to next must be a path on this site, without control characters or backslashes")]
    NotLocalPath,
    #[error("{0}")]
    SignInFailed(SignInProblem),
    #[error("{0}")]
    InvalidQuota(String),
    #[error("there is no tier called \"{0}\"; choose guaranteed or spot")]
    InvalidTier(String),
    #[error("your quota does not allow spot bookings; book within your quota instead")]
    SpotNotAllowed,
    #[error("there is no project \"{0}\" you can book in")]
    UnknownProject(String),
    #[error("spot bookings start now; leave the start empty or book guaranteed capacity ahead")]
    SpotStartsNow,
    #[error("node {node} has no GPU {index}")]
    UnknownGpu { node: String, index: i64 },
    #[error("health must be healthy, degraded or failed, not \"{0}\"")]
    InvalidHealth(String),
    #[error("reason {0}")]
    InvalidReason(&'static str),
    #[error("fleet description: {0}")]
    InvalidFleet(String),
    #[error("fabric settings: {0}")]
    InvalidFabricPool(String),
    #[error(
        "no free {what} left in {range} ({in_quarantine} waiting out their quarantine); widen the pool or wait for the quarantine to end"
    )]
    FabricPoolExhausted { what: &'static str, range: String, in_quarantine: usize },
    #[error("\"{0}\" is not an InfiniBand port GUID; write 0x and 16 hex digits, e.g. 0x0002c9030001e3f1")]
    InvalidPortGuid(String),
    #[error("a tenant may list at most {max} port GUIDs")]
    TooManyPortGuids { max: usize },
    #[error("port GUID {guid} is already in tenant {tenant}'s partition; remove it there first")]
    PortGuidInUse { guid: String, tenant: String },
    #[error("this tenant has no InfiniBand partition; only hard and hybrid tenants get a P_Key")]
    NoInfinibandPartition,
    #[error("{0} has no replicas; only inference endpoints scale")]
    NoReplicas(&'static str),
    #[error("replicas must be a whole number between 1 and {max}")]
    InvalidReplicas { max: u32 },
    #[error("this endpoint is {0}; its replicas can change while it is ready")]
    NotScalable(&'static str),
    #[error("this environment is {0}; it can be opened once it is ready")]
    NotReady(&'static str),
    #[error("{0} has no API key; only inference endpoints have one")]
    NoApiKey(&'static str),
    #[error("an inference endpoint answers requests that carry its API key: Authorization: Bearer <key>")]
    ApiKeyRequired,
    #[error("the API key was shown once already and Berth keeps only its hash; replace it to get a new one")]
    ApiKeyAlreadyShown,
    #[error("this endpoint's API key is made when it is first ready")]
    ApiKeyNotYetMade,
    #[error("{0} writes no logs here; only training jobs do")]
    NoJobLogs(&'static str),
    /// The backend could not answer; the text is its operational message.
    #[error("the workload cannot be reached right now: {0}")]
    WorkloadUnreachable(String),
    #[error("node report refused: {0}")]
    InvalidReport(String),
    #[error("host network: {0}")]
    InvalidHostNetwork(String),
    /// What is wrong with a pasted SSH public key, in words that say what to paste instead.
    #[error("SSH key: {0}")]
    InvalidSshKey(String),
    #[error("you added this SSH key already (as \"{0}\")")]
    SshKeyInUse(String),
    #[error("you can keep at most {max} SSH keys; remove one first")]
    TooManySshKeys { max: usize },
    #[error("node access: {0}")]
    InvalidNodeAccess(String),
    #[error("Idempotency-Key {0}")]
    InvalidIdempotencyKey(&'static str),
    /// A retry must repeat its request: the same key with another body is a new request
    /// that reused a key by mistake, and must not be answered with the first booking.
    #[error(
        "this Idempotency-Key was already used for a different request in the last {hours} hours; \
         send the same request to retry it, or a new key for a new request"
    )]
    IdempotencyKeyReused { hours: i64 },
    #[error("volume name: {0}")]
    InvalidVolumeName(String),
    #[error("volume size: {0}")]
    InvalidVolumeSize(String),
    /// Whose storage limit a volume does not fit, and what is left of it.
    #[error("storage quota: {0}")]
    StorageQuotaExceeded(String),
    #[error("there is no volume \"{0}\" you can use")]
    UnknownVolume(String),
    #[error("volume \"{0}\" belongs to another project; book in that project to attach it")]
    VolumeNotInProject(String),
    #[error("two volumes would be mounted at {0}; attach only one of them")]
    VolumeMountClash(String),
    #[error("there is already a volume called \"{0}\" here; pick another name")]
    VolumeNameInUse(String),
    #[error("volume \"{name}\" is attached to {environment}; stop it first, then delete the volume")]
    VolumeAttached { name: String, environment: String },
    #[error(
        "volume \"{name}\" is attached to {environment}; a hard tenant's volumes (and platform staff's) are attached to one environment at a time"
    )]
    VolumeInUse { name: String, environment: String },
    #[error("{0} cannot have volumes attached; notebooks and training jobs can")]
    NoVolumes(&'static str),
    #[error(
        "volume \"{name}\" holds {used} GiB, more than its {size_gib} GiB; grow it to {needed_gib} GiB or more on the volumes page to attach it again"
    )]
    VolumeOverSize { name: String, used: String, size_gib: u32, needed_gib: u32 },
    /// An inference endpoint's model, server arguments or variables (`serving.rs`).
    #[error("model {0}")]
    InvalidModel(&'static str),
    #[error("arguments {0}")]
    InvalidArguments(String),
    #[error("environment variables: {0}")]
    InvalidEnv(String),
    #[error("only an inference endpoint takes a model, arguments or environment variables ({0} does not)")]
    ServingNotAllowed(&'static str),
    #[error("{0}")]
    InvalidIdlePolicy(String),
    #[error("cannot keep it: {0}")]
    KeepsUsedUp(String),
    #[error("{0} is not ready: only a ready environment is judged idle and can be kept")]
    NotKeepable(String),
}

impl Refusal {
    /// The form argument a refusal is about, where it is about one field: its name as a
    /// form sends it (the last part of `request[name]`), so a page can mark that field
    /// (`aria-invalid`) and put the reason beside it.
    pub fn field(&self) -> Option<&'static str> {
        use Refusal::*;
        Some(match self {
            InvalidName(_) | NameInUse(_) | InvalidVolumeName(_) | VolumeNameInUse(_) => "name",
            InvalidDuration { .. } | TooLong { .. } => "hours",
            ImageRequired(_) | InvalidImage(_) | NoCatalogImage(_) | ImageNotInCatalog(_) => "image",
            CommandRequired(_) | InvalidCommand(_) => "command",
            InvalidStart(_) | StartInPast => "start",
            InvalidEnd(_) | EndNotAfterStart => "end",
            InvalidEarliestSearch(_) => "earliest_within_days",
            InvalidModels(_) => "models",
            InvalidVolumeSize(_) => "size_gib",
            InvalidEmail(_) | EmailInUse(_) => "email",
            InvalidSlug(_) | SlugInUse(_) => "slug",
            InvalidIssuer(_) | PrivateIssuer(_) => "issuer",
            InvalidSshKey(_) | SshKeyInUse(_) => "public_key",
            WrongPassword => "current",
            WrongCode => "code",
            WeakPassword(_) | SamePassword => "password",
            UnknownNode(_) => "node",
            UnknownGpu { .. } => "gpu",
            InvalidReason(_) => "reason",
            InvalidModel(_) => "model",
            InvalidArguments(_) => "args",
            InvalidEnv(_) => "env",
            _ => return None,
        })
    }
}

/// Why a single sign-on did not end in a session. The sign-in page is sent only the code,
/// never words of the request's own, so a link cannot make Berth's page say anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SignInProblem {
    #[error("there is no such sign-in option")]
    UnknownProvider,
    #[error(
        "no organization here signs in with that email or name; ask your tenant admin for your organization's sign-in link"
    )]
    UnknownOrganization,
    #[error("could not reach your identity provider; try again later")]
    Unreachable,
    #[error("your identity provider did not sign you in")]
    Declined,
    #[error("this sign-in link has expired or was already used; start again")]
    Expired,
    #[error("your identity provider's answer could not be verified; start again")]
    Unverified,
    #[error("your account has no access to Berth yet; ask your tenant admin to invite you or map your group")]
    NoAccess,
    #[error("this account cannot sign in here; ask your tenant admin")]
    NotHere,
    #[error("too many sign-in attempts from your address; wait a minute and try again")]
    TooMany,
    #[error("the page to go to after signing in must be a path on this site")]
    NotLocalPath,
    #[error("single sign-on failed on our side; try again")]
    Internal,
}

impl SignInProblem {
    const ALL: [SignInProblem; 11] = [
        SignInProblem::UnknownProvider,
        SignInProblem::UnknownOrganization,
        SignInProblem::Unreachable,
        SignInProblem::Declined,
        SignInProblem::Expired,
        SignInProblem::Unverified,
        SignInProblem::NoAccess,
        SignInProblem::NotHere,
        SignInProblem::TooMany,
        SignInProblem::NotLocalPath,
        SignInProblem::Internal,
    ];

    /// The code the sign-in page's `sso_error` carries.
    pub fn code(self) -> &'static str {
        match self {
            SignInProblem::UnknownProvider => "unknown-provider",
            SignInProblem::UnknownOrganization => "unknown-organization",
            SignInProblem::Unreachable => "unreachable",
            SignInProblem::Declined => "declined",
            SignInProblem::Expired => "expired",
            SignInProblem::Unverified => "unverified",
            SignInProblem::NoAccess => "no-access",
            SignInProblem::NotHere => "not-here",
            SignInProblem::TooMany => "too-many",
            SignInProblem::NotLocalPath => "not-local-path",
            SignInProblem::Internal => "internal",
        }
    }

    /// The problem a code names; any other text is a generic failure, never shown as it is.
    pub fn from_code(code: &str) -> SignInProblem {
        SignInProblem::ALL.into_iter().find(|p| p.code() == code).unwrap_or(SignInProblem::Internal)
    }
}

#[cfg(test)]
mod tests {
    use super::SignInProblem;

    #[test]
    fn every_sign_in_problem_round_trips_and_anything_else_is_generic() {
        for problem in SignInProblem::ALL {
            assert_eq!(SignInProblem::from_code(problem.code()), problem);
        }
        assert_eq!(SignInProblem::from_code("Your account is suspended: call +1 555"), SignInProblem::Internal);
    }
}
