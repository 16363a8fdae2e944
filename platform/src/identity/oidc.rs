//! Signing in with OpenID Connect: the relying-party side of the protocol, and nothing else.
//!
//! This module owns discovery, the authorization request, the callback checks, the code
//! exchange, ID token verification and the userinfo look-up. Storing the pending login under
//! its single-use `state`, tying it to the browser session that started it, and mapping an
//! [`Identity`] to a Berth user are the caller's job.
//!
//! ```text
//! pub struct ProviderConfig { issuer, client_id, client_secret: Option, redirect_url, groups_claim }
//! #[derive(Clone)] pub struct Client                      // discovered provider, cheap to clone
//! Client::discover(ProviderConfig) -> Result<Client, OidcError>          (async)
//! Client::begin(&self) -> (String /* authorization URL */, PendingLogin)
//! Client::finish(&self, &PendingLogin, &Callback) -> Result<Identity, OidcError>  (async)
//! pub struct PendingLogin { state, nonce, pkce_verifier }  // Serialize + Deserialize, keep server side
//! pub struct Callback { code, state, iss: Option }         // the redirect's query parameters
//! pub struct Identity { issuer, subject, email: Option, name: Option, groups: Vec }
//! pub enum OidcError { .. }  and  pub enum IdTokenProblem { .. }
//! ```
//!
//! What `finish` guarantees when it returns an [`Identity`]:
//! - the callback's `state` equals the pending login's (constant-time compare), and its `iss`
//!   parameter, when present or when the provider promises it (RFC 9207), equals the issuer;
//! - the code was exchanged with the PKCE S256 verifier of this login;
//! - the ID token is signed with an asymmetric algorithm the provider advertises (never
//!   `none`, never HMAC) by a key of the provider's JWKS, has exactly our issuer, our client id
//!   among its audiences (and `azp` equal to it when there are several or when present), is
//!   unexpired, was issued recently and not in the future, carries this login's nonce, a
//!   matching `at_hash` when it has one, and a non-empty `sub`;
//! - an unknown `kid` made the client refetch the JWKS at most once per
//!   [`JWKS_REFETCH_INTERVAL`], shared by every clone, so keys rotate without a restart;
//! - groups come from the configured claim of the ID token, else from userinfo whose `sub`
//!   must equal the ID token's; an email is only returned when the provider says it is
//!   verified.
//!
//! Error messages are meant for logs: they never contain tokens, codes, nonces, verifiers or
//! secrets. A user should only ever be shown a generic "sign-in failed".

use std::error::Error as StdError;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::prelude::BASE64_URL_SAFE_NO_PAD;
use chrono::Utc;
use openidconnect::core::{
    CoreAuthDisplay, CoreAuthPrompt, CoreAuthenticationFlow, CoreClaimName, CoreClaimType, CoreClientAuthMethod,
    CoreErrorResponseType, CoreGenderClaim, CoreGrantType, CoreJsonWebKey, CoreJsonWebKeySet,
    CoreJweContentEncryptionAlgorithm, CoreJweKeyManagementAlgorithm, CoreJwsSigningAlgorithm, CoreResponseMode,
    CoreResponseType, CoreRevocableToken, CoreRevocationErrorResponse, CoreSubjectIdentifierType,
    CoreTokenIntrospectionResponse, CoreTokenType,
};
use openidconnect::{
    AccessTokenHash, AdditionalClaims, AdditionalProviderMetadata, AuthorizationCode, ClaimsVerificationError,
    ClientId, ClientSecret, CsrfToken, DiscoveryError, EmptyExtraTokenFields, EndpointMaybeSet, EndpointNotSet,
    EndpointSet, IdToken, IdTokenClaims, IdTokenFields, IdTokenVerifier, IssuerUrl, Nonce, OAuth2TokenResponse,
    PkceCodeChallenge, PkceCodeVerifier, ProviderMetadata, RedirectUrl, RequestTokenError, Scope,
    SignatureVerificationError, StandardErrorResponse, StandardTokenResponse, TokenResponse, UserInfoClaims,
    UserInfoError,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use subtle::ConstantTimeEq;

pub use berth_domain::outbound::Reach;

use crate::identity::provider_http::ProviderHttp;

/// A token with an unknown `kid` makes a client refetch the JWKS at most this often, so forged
/// tokens cannot turn Berth into a load generator against the provider.
pub const JWKS_REFETCH_INTERVAL: Duration = Duration::from_secs(10);
/// Clock difference tolerated between Berth and the provider for `exp` and `iat`.
const CLOCK_SKEW: chrono::TimeDelta = chrono::TimeDelta::seconds(60);
/// An ID token fresh from the token endpoint older than this is refused.
const MAX_ID_TOKEN_AGE: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// The signature algorithms Berth accepts for ID tokens, if the provider advertises them.
/// Asymmetric only: HMAC would let anyone holding the key (for a public client, anyone)
/// forge tokens, and `none` is no signature at all.
const ASYMMETRIC_ALGS: [CoreJwsSigningAlgorithm; 9] = [
    CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
    CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha384,
    CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha512,
    CoreJwsSigningAlgorithm::RsaSsaPssSha256,
    CoreJwsSigningAlgorithm::RsaSsaPssSha384,
    CoreJwsSigningAlgorithm::RsaSsaPssSha512,
    CoreJwsSigningAlgorithm::EcdsaP256Sha256,
    CoreJwsSigningAlgorithm::EcdsaP384Sha384,
    CoreJwsSigningAlgorithm::EdDsa,
];

/// One OpenID provider as the operator configured it.
#[derive(Clone)]
pub struct ProviderConfig {
    /// The exact issuer URL; discovery and every ID token must name exactly this.
    pub issuer: String,
    pub client_id: String,
    /// None for a public client (PKCE only).
    pub client_secret: Option<String>,
    /// Where the provider sends the browser back, e.g. `http://127.0.0.1:3000/auth/oidc/callback`.
    pub redirect_url: String,
    /// The claim carrying group names, usually `groups`.
    pub groups_claim: String,
    /// Whether the provider and the URLs it names may be on private addresses.
    pub reach: Reach,
}

impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "<redacted>"))
            .field("redirect_url", &self.redirect_url)
            .field("groups_claim", &self.groups_claim)
            .finish()
    }
}

/// What `begin` hands out and `finish` needs back: keep it server side, under `state`, for one
/// use only.
#[derive(Clone, Serialize, Deserialize)]
pub struct PendingLogin {
    pub state: String,
    pub nonce: String,
    pub pkce_verifier: String,
}

impl fmt::Debug for PendingLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingLogin")
            .field("state", &"<redacted>")
            .field("nonce", &"<redacted>")
            .field("pkce_verifier", &"<redacted>")
            .finish()
    }
}

/// The query parameters of the redirect back from the provider.
#[derive(Clone)]
pub struct Callback {
    pub code: String,
    pub state: String,
    /// RFC 9207 `iss` parameter, when the provider sends one.
    pub iss: Option<String>,
}

impl fmt::Debug for Callback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Callback")
            .field("code", &"<redacted>")
            .field("state", &"<redacted>")
            .field("iss", &self.iss)
            .finish()
    }
}

/// Who signed in. A user is the pair (`issuer`, `subject`), never the email alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub issuer: String,
    pub subject: String,
    /// Only when the provider marks it verified.
    pub email: Option<String>,
    pub name: Option<String>,
    pub groups: Vec<String>,
}

/// Why an ID token was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdTokenProblem {
    /// The token response had no `id_token`.
    Missing,
    /// Not a compact JWS with the required claims.
    Malformed,
    /// No (or an empty) `sub` claim.
    MissingSubject,
    /// `alg` is `none`, HMAC, or not one the provider advertises.
    Algorithm,
    /// The signature does not verify with the key the token names.
    Signature,
    Issuer,
    Audience,
    /// `azp` missing with several audiences, or not our client id.
    AuthorizedParty,
    Expired,
    /// `iat` in the future or too long ago.
    IssuedAt,
    Nonce,
    /// `at_hash` does not match the access token.
    AccessTokenHash,
    /// Encrypted, nested, or with header features Berth does not understand.
    Unsupported,
}

impl fmt::Display for IdTokenProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdTokenProblem::Missing => "no ID token in the token response",
            IdTokenProblem::Malformed => "malformed",
            IdTokenProblem::MissingSubject => "missing subject",
            IdTokenProblem::Algorithm => "signature algorithm not allowed",
            IdTokenProblem::Signature => "bad signature",
            IdTokenProblem::Issuer => "wrong issuer",
            IdTokenProblem::Audience => "wrong audience",
            IdTokenProblem::AuthorizedParty => "wrong authorized party",
            IdTokenProblem::Expired => "expired",
            IdTokenProblem::IssuedAt => "issue time out of range",
            IdTokenProblem::Nonce => "nonce mismatch",
            IdTokenProblem::AccessTokenHash => "at_hash mismatch",
            IdTokenProblem::Unsupported => "unsupported token form",
        })
    }
}

/// Every way signing in can fail. Messages are for logs and never carry tokens, codes or
/// secrets.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    #[error("OpenID provider configuration invalid: {0}")]
    Config(String),
    #[error("OpenID discovery failed: {0}")]
    Discovery(String),
    #[error("OpenID discovery issuer mismatch: {0}")]
    IssuerMismatch(String),
    #[error("callback state does not match the pending login")]
    StateMismatch,
    #[error("callback iss parameter `{received}` is not the provider's issuer")]
    IssParameterMismatch { received: String },
    #[error("callback lacks the iss parameter the provider promises")]
    IssParameterMissing,
    #[error("provider refused the authorization code: {error}")]
    CodeRejected { error: String },
    #[error("token exchange failed: {0}")]
    TokenExchange(String),
    #[error("ID token refused, {problem}: {detail}")]
    IdTokenInvalid { problem: IdTokenProblem, detail: String },
    #[error("ID token signed with unknown key id {kid:?}, even after refetching the JWKS")]
    UnknownKeyId { kid: Option<String> },
    #[error("refetching the provider's JWKS failed: {0}")]
    KeyFetch(String),
    #[error("userinfo request failed: {0}")]
    UserInfo(String),
    #[error("userinfo subject differs from the ID token's")]
    UserInfoSubjectMismatch,
}

impl OidcError {
    fn id_token(problem: IdTokenProblem, detail: impl Into<String>) -> OidcError {
        OidcError::IdTokenInvalid { problem, detail: detail.into() }
    }
}

/// Claims beyond the standard ones, kept as JSON so the groups claim name can be configured.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
struct OtherClaims {
    #[serde(flatten)]
    claims: Map<String, Value>,
}
impl AdditionalClaims for OtherClaims {}

/// The one non-standard discovery field Berth reads (RFC 9207).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
struct IssParameterSupport {
    #[serde(default)]
    authorization_response_iss_parameter_supported: bool,
}
impl AdditionalProviderMetadata for IssParameterSupport {}

type Metadata = ProviderMetadata<
    IssParameterSupport,
    CoreAuthDisplay,
    CoreClientAuthMethod,
    CoreClaimName,
    CoreClaimType,
    CoreGrantType,
    CoreJweContentEncryptionAlgorithm,
    CoreJweKeyManagementAlgorithm,
    CoreJsonWebKey,
    CoreResponseMode,
    CoreResponseType,
    CoreSubjectIdentifierType,
>;

type BerthIdToken = IdToken<OtherClaims, CoreGenderClaim, CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm>;
type BerthIdTokenClaims = IdTokenClaims<OtherClaims, CoreGenderClaim>;

type BerthTokenResponse = StandardTokenResponse<
    IdTokenFields<
        OtherClaims,
        EmptyExtraTokenFields,
        CoreGenderClaim,
        CoreJweContentEncryptionAlgorithm,
        CoreJwsSigningAlgorithm,
    >,
    CoreTokenType,
>;

/// The crate's client as discovery leaves it: authorization endpoint set, token and userinfo
/// endpoints present if the provider lists them.
type ProtocolClient = openidconnect::Client<
    OtherClaims,
    CoreAuthDisplay,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJsonWebKey,
    CoreAuthPrompt,
    StandardErrorResponse<CoreErrorResponseType>,
    BerthTokenResponse,
    CoreTokenIntrospectionResponse,
    CoreRevocableToken,
    CoreRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// A discovered provider: metadata and JWKS, cheap to clone, shareable across requests.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

struct Shared {
    config: ProviderConfig,
    metadata: Metadata,
    redirect_url: RedirectUrl,
    http: ProviderHttp,
    /// The provider's advertised algorithms that Berth accepts.
    allowed_algs: Vec<CoreJwsSigningAlgorithm>,
    scopes: Vec<Scope>,
    /// The current key set; replaced whole when refetched.
    keys: RwLock<Arc<CoreJsonWebKeySet>>,
    /// When the JWKS was last refetched; held while refetching so concurrent logins with a
    /// new `kid` wait for one fetch instead of each making their own.
    last_refetch: tokio::sync::Mutex<Option<Instant>>,
}

impl Client {
    /// Reads the provider's discovery document and JWKS. The document's issuer must equal
    /// `config.issuer` exactly.
    pub async fn discover(config: ProviderConfig) -> Result<Client, OidcError> {
        let issuer = IssuerUrl::new(config.issuer.clone())
            .map_err(|e| OidcError::Config(format!("issuer `{}`: {e}", config.issuer)))?;
        let redirect_url = RedirectUrl::new(config.redirect_url.clone())
            .map_err(|e| OidcError::Config(format!("redirect URL `{}`: {e}", config.redirect_url)))?;
        if config.client_id.is_empty() {
            return Err(OidcError::Config("empty client id".into()));
        }
        let http = ProviderHttp::new(config.reach)
            .map_err(|e| OidcError::Config(format!("HTTP client: {}", error_chain(&e))))?;

        let metadata = Metadata::discover_async(issuer, &http).await.map_err(|e| match e {
            // The crate's only validation of a parsed document is the exact issuer match.
            DiscoveryError::Validation(detail) => OidcError::IssuerMismatch(detail),
            other => OidcError::Discovery(discovery_detail(&other)),
        })?;
        if metadata.issuer().as_str() != config.issuer {
            return Err(OidcError::IssuerMismatch(format!(
                "expected `{}`, discovery says `{}`",
                config.issuer,
                metadata.issuer().as_str()
            )));
        }
        if metadata.token_endpoint().is_none() {
            return Err(OidcError::Discovery("the provider lists no token endpoint".into()));
        }

        let advertised = metadata.id_token_signing_alg_values_supported();
        let allowed_algs: Vec<_> = ASYMMETRIC_ALGS.iter().filter(|alg| advertised.contains(alg)).cloned().collect();
        if allowed_algs.is_empty() {
            return Err(OidcError::Discovery(
                "the provider signs ID tokens with no asymmetric algorithm Berth accepts".into(),
            ));
        }

        let mut scopes = vec![Scope::new("email".into()), Scope::new("profile".into())];
        let groups_scope = Scope::new("groups".into());
        if metadata.scopes_supported().is_some_and(|s| s.contains(&groups_scope)) {
            scopes.push(groups_scope);
        }

        let keys = RwLock::new(Arc::new(metadata.jwks().clone()));
        Ok(Client {
            shared: Arc::new(Shared {
                config,
                metadata,
                redirect_url,
                http,
                allowed_algs,
                scopes,
                keys,
                last_refetch: tokio::sync::Mutex::new(None),
            }),
        })
    }

    /// Starts a login: the URL to send the browser to, and what to keep until the callback.
    /// Authorization code flow with PKCE S256, random state and nonce; scopes `openid email
    /// profile`, plus `groups` when the provider advertises it.
    pub fn begin(&self) -> (String, PendingLogin) {
        let keys = self.current_keys();
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let (url, state, nonce) = self
            .protocol_client(&keys)
            .authorize_url(CoreAuthenticationFlow::AuthorizationCode, CsrfToken::new_random, Nonce::new_random)
            .add_scopes(self.shared.scopes.iter().cloned())
            .set_pkce_challenge(challenge)
            .url();
        let pending = PendingLogin {
            state: state.secret().clone(),
            nonce: nonce.secret().clone(),
            pkce_verifier: verifier.secret().clone(),
        };
        (url.to_string(), pending)
    }

    /// Checks the callback against the pending login and the provider, exchanges the code,
    /// verifies the ID token and returns who signed in.
    pub async fn finish(&self, pending: &PendingLogin, callback: &Callback) -> Result<Identity, OidcError> {
        let config = &self.shared.config;
        let same_state: bool = callback.state.as_bytes().ct_eq(pending.state.as_bytes()).into();
        if !same_state || pending.state.is_empty() {
            return Err(OidcError::StateMismatch);
        }
        match &callback.iss {
            Some(iss) if *iss != config.issuer => {
                return Err(OidcError::IssParameterMismatch { received: iss.clone() });
            }
            Some(_) => {}
            None if self.shared.metadata.additional_metadata().authorization_response_iss_parameter_supported => {
                return Err(OidcError::IssParameterMissing);
            }
            None => {}
        }

        let mut keys = self.current_keys();
        let token = self
            .protocol_client(&keys)
            .exchange_code(AuthorizationCode::new(callback.code.clone()))
            .map_err(|e| OidcError::TokenExchange(e.to_string()))?
            .set_pkce_verifier(PkceCodeVerifier::new(pending.pkce_verifier.clone()))
            .request_async(&self.shared.http)
            .await
            .map_err(token_error)?;
        let id_token = token.id_token().ok_or_else(|| OidcError::id_token(IdTokenProblem::Missing, "none returned"))?;
        let nonce = Nonce::new(pending.nonce.clone());

        let claims = match self.verify(id_token, &keys, &nonce, &token) {
            Err(OidcError::UnknownKeyId { kid }) => {
                keys = self.refetch_keys(&keys).await?.ok_or(OidcError::UnknownKeyId { kid })?;
                self.verify(id_token, &keys, &nonce, &token)?
            }
            other => other?,
        };

        let subject = claims.subject().as_str().to_owned();
        let mut email = verified_email(claims.email().map(|e| e.as_str()), claims.email_verified());
        let mut name = claims.name().and_then(|n| n.get(None)).map(|n| n.as_str().to_owned());
        let groups = match claims.additional_claims().claims.get(&config.groups_claim) {
            Some(value) => group_names(value),
            None if self.shared.metadata.userinfo_endpoint().is_some() => {
                let info = self.user_info(&keys, &token, &claims).await?;
                if claims.email().is_none() {
                    email = verified_email(info.email().map(|e| e.as_str()), info.email_verified());
                }
                if name.is_none() {
                    name = info.name().and_then(|n| n.get(None)).map(|n| n.as_str().to_owned());
                }
                info.additional_claims().claims.get(&config.groups_claim).map(group_names).unwrap_or_default()
            }
            None => Vec::new(),
        };

        Ok(Identity { issuer: config.issuer.clone(), subject, email, name, groups })
    }

    /// Verifies the ID token against one key set. An unknown key comes back as
    /// `UnknownKeyId` so the caller can refetch and try again.
    fn verify(
        &self,
        id_token: &BerthIdToken,
        keys: &CoreJsonWebKeySet,
        nonce: &Nonce,
        token: &BerthTokenResponse,
    ) -> Result<BerthIdTokenClaims, OidcError> {
        let config = &self.shared.config;
        // A public-client verifier holds no secret, so no HMAC can verify even if an HS* alg
        // slipped through; the allowed list excludes them anyway.
        let verifier: IdTokenVerifier<'_, CoreJsonWebKey> = IdTokenVerifier::new_public_client(
            ClientId::new(config.client_id.clone()),
            self.shared.metadata.issuer().clone(),
            keys.clone(),
        )
        .set_allowed_algs(self.shared.allowed_algs.iter().cloned())
        // Other audiences are allowed only with `azp` naming us, checked below (OIDC Core 3.1.3.7).
        .set_other_audience_verifier_fn(|_| true)
        .set_time_fn(|| Utc::now() - CLOCK_SKEW);

        let claims = id_token.claims(&verifier, nonce).map_err(|e| claims_error(e, id_token_kid(id_token)))?;

        if claims.subject().as_str().is_empty() {
            return Err(OidcError::id_token(IdTokenProblem::MissingSubject, "empty sub"));
        }
        let audiences = claims.audiences();
        match claims.authorized_party() {
            Some(azp) if azp.as_str() != config.client_id => {
                return Err(OidcError::id_token(IdTokenProblem::AuthorizedParty, format!("azp is `{}`", azp.as_str())));
            }
            None if audiences.len() > 1 => {
                return Err(OidcError::id_token(IdTokenProblem::AuthorizedParty, "several audiences and no azp"));
            }
            _ => {}
        }
        let now = Utc::now();
        let issued = claims.issue_time();
        if issued > now + CLOCK_SKEW || issued < now - MAX_ID_TOKEN_AGE - CLOCK_SKEW {
            return Err(OidcError::id_token(IdTokenProblem::IssuedAt, format!("issued at {issued}, now {now}")));
        }
        if let Some(expected) = claims.access_token_hash() {
            let alg =
                id_token.signing_alg().map_err(|e| OidcError::id_token(IdTokenProblem::Algorithm, e.to_string()))?;
            let key = id_token
                .signing_key(&verifier)
                .map_err(|e| OidcError::id_token(IdTokenProblem::Signature, e.to_string()))?;
            let actual = AccessTokenHash::from_token(token.access_token(), alg, key)
                .map_err(|e| OidcError::id_token(IdTokenProblem::AccessTokenHash, e.to_string()))?;
            if actual.as_str() != expected.as_str() {
                return Err(OidcError::id_token(
                    IdTokenProblem::AccessTokenHash,
                    "at_hash does not match the access token",
                ));
            }
        }
        Ok(claims.clone())
    }

    /// Userinfo, whose `sub` must be the ID token's.
    async fn user_info(
        &self,
        keys: &CoreJsonWebKeySet,
        token: &BerthTokenResponse,
        claims: &BerthIdTokenClaims,
    ) -> Result<UserInfoClaims<OtherClaims, CoreGenderClaim>, OidcError> {
        let client = self.protocol_client(keys);
        let request = client
            .user_info(token.access_token().clone(), Some(claims.subject().clone()))
            .map_err(|e| OidcError::UserInfo(e.to_string()))?;
        request.request_async(&self.shared.http).await.map_err(|e| match e {
            UserInfoError::ClaimsVerification(ClaimsVerificationError::InvalidSubject(_)) => {
                OidcError::UserInfoSubjectMismatch
            }
            UserInfoError::ClaimsVerification(other) => {
                OidcError::UserInfo(format!("signed userinfo refused: {other}"))
            }
            UserInfoError::Parse(err) => OidcError::UserInfo(parse_detail(err.path(), err.inner())),
            UserInfoError::Request(err) => OidcError::UserInfo(error_chain(&err)),
            UserInfoError::Response(status, _body, detail) => OidcError::UserInfo(format!("HTTP {status}: {detail}")),
            other => OidcError::UserInfo(other.to_string()),
        })
    }

    fn current_keys(&self) -> Arc<CoreJsonWebKeySet> {
        crate::read(&self.shared.keys).clone()
    }

    /// Refetches the JWKS unless that was done less than `JWKS_REFETCH_INTERVAL` ago. Returns
    /// the key set to retry with, or None when there is nothing new to try.
    async fn refetch_keys(&self, seen: &Arc<CoreJsonWebKeySet>) -> Result<Option<Arc<CoreJsonWebKeySet>>, OidcError> {
        let mut last = self.shared.last_refetch.lock().await;
        let current = self.current_keys();
        if !Arc::ptr_eq(&current, seen) {
            // Another login refetched while this one waited.
            return Ok(Some(current));
        }
        if last.is_some_and(|at| at.elapsed() < JWKS_REFETCH_INTERVAL) {
            return Ok(None);
        }
        // Counted before the fetch so a failing JWKS endpoint is not hammered either.
        *last = Some(Instant::now());
        let fetched = CoreJsonWebKeySet::fetch_async(self.shared.metadata.jwks_uri(), &self.shared.http)
            .await
            .map_err(|e| OidcError::KeyFetch(discovery_detail(&e)))?;
        let fresh = Arc::new(fetched);
        *crate::write(&self.shared.keys) = fresh.clone();
        tracing::info!(issuer = %self.shared.config.issuer, keys = fresh.keys().len(), "refetched OpenID provider keys");
        Ok(Some(fresh))
    }

    fn protocol_client(&self, keys: &CoreJsonWebKeySet) -> ProtocolClient {
        let shared = &self.shared;
        ProtocolClient::from_provider_metadata(
            shared.metadata.clone().set_jwks(keys.clone()),
            ClientId::new(shared.config.client_id.clone()),
            shared.config.client_secret.clone().map(ClientSecret::new),
        )
        .set_redirect_uri(shared.redirect_url.clone())
    }
}

fn verified_email(email: Option<&str>, verified: Option<bool>) -> Option<String> {
    match (email, verified) {
        (Some(email), Some(true)) => Some(email.to_owned()),
        _ => None,
    }
}

/// A groups claim is a JSON array of strings or a single string; anything else means none.
fn group_names(value: &Value) -> Vec<String> {
    match value {
        Value::String(one) => vec![one.clone()],
        Value::Array(items) => items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
        _ => Vec::new(),
    }
}

fn id_token_kid(id_token: &BerthIdToken) -> Option<String> {
    // The header is not exposed by the crate; read it from the compact form. Only the key id
    // is taken, for the error message.
    let header = id_token.to_string();
    let header = header.split('.').next()?;
    let bytes = BASE64_URL_SAFE_NO_PAD.decode(header).ok()?;
    let json: Value = serde_json::from_slice(&bytes).ok()?;
    json.get("kid").and_then(Value::as_str).map(str::to_owned)
}

fn claims_error(err: ClaimsVerificationError, kid: Option<String>) -> OidcError {
    use IdTokenProblem as P;
    match err {
        ClaimsVerificationError::Expired(d) => OidcError::id_token(P::Expired, d),
        ClaimsVerificationError::InvalidAudience(d) => OidcError::id_token(P::Audience, d),
        ClaimsVerificationError::InvalidIssuer(d) => OidcError::id_token(P::Issuer, d),
        ClaimsVerificationError::InvalidNonce(d) => OidcError::id_token(P::Nonce, d),
        ClaimsVerificationError::InvalidSubject(d) => OidcError::id_token(P::MissingSubject, d),
        ClaimsVerificationError::Unsupported(d) => OidcError::id_token(P::Unsupported, d),
        ClaimsVerificationError::SignatureVerification(sig) => match sig {
            SignatureVerificationError::NoMatchingKey => OidcError::UnknownKeyId { kid },
            SignatureVerificationError::NoSignature => OidcError::id_token(P::Algorithm, "alg `none` (unsigned)"),
            e @ (SignatureVerificationError::DisallowedAlg(_) | SignatureVerificationError::UnsupportedAlg(_)) => {
                OidcError::id_token(P::Algorithm, e.to_string())
            }
            other => OidcError::id_token(P::Signature, other.to_string()),
        },
        other => OidcError::id_token(P::Malformed, other.to_string()),
    }
}

fn token_error(
    err: RequestTokenError<
        openidconnect::HttpClientError<reqwest::Error>,
        StandardErrorResponse<CoreErrorResponseType>,
    >,
) -> OidcError {
    match err {
        RequestTokenError::ServerResponse(response) => {
            let mut error = response.error().to_string();
            if let Some(description) = response.error_description() {
                error = format!("{error} ({description})");
            }
            OidcError::CodeRejected { error }
        }
        RequestTokenError::Parse(err, body) => match unreadable_id_token(&body) {
            // The crate reads the ID token while parsing the whole response; tell a missing
            // subject apart, since that is a provider misconfiguration worth naming.
            Some(problem) => OidcError::id_token(problem, "not a JWS with the required claims"),
            None => OidcError::TokenExchange(parse_detail(err.path(), err.inner())),
        },
        RequestTokenError::Request(err) => OidcError::TokenExchange(error_chain(&err)),
        RequestTokenError::Other(detail) => OidcError::TokenExchange(detail),
    }
}

/// Why the `id_token` of an unparseable token response is unreadable, or None when it is
/// readable (or absent) and the fault lies elsewhere. Claim values are never logged.
fn unreadable_id_token(token_response_body: &[u8]) -> Option<IdTokenProblem> {
    let response: Value = serde_json::from_slice(token_response_body).ok()?;
    let compact = response.get("id_token")?.as_str()?;
    if compact.parse::<BerthIdToken>().is_ok() {
        return None;
    }
    let claims = compact
        .split('.')
        .nth(1)
        .and_then(|payload| BASE64_URL_SAFE_NO_PAD.decode(payload).ok())
        .and_then(|json| serde_json::from_slice::<Map<String, Value>>(&json).ok());
    match claims {
        Some(claims) if !claims.get("sub").is_some_and(Value::is_string) => Some(IdTokenProblem::MissingSubject),
        _ => Some(IdTokenProblem::Malformed),
    }
}

/// Where a JSON document failed to parse, without echoing any of its values.
fn parse_detail(path: impl fmt::Display, inner: &serde_json::Error) -> String {
    format!("unreadable response at `{path}` ({})", classify(inner))
}

fn classify(err: &serde_json::Error) -> String {
    format!("{:?} error at line {} column {}", err.classify(), err.line(), err.column())
}

fn discovery_detail<RE: StdError + 'static>(err: &DiscoveryError<RE>) -> String {
    match err {
        DiscoveryError::Parse(parse) => parse_detail(parse.path(), parse.inner()),
        DiscoveryError::Request(request) => error_chain(request),
        DiscoveryError::Response(status, _body, detail) => format!("HTTP {status}: {detail}"),
        other => other.to_string(),
    }
}

/// An error and its causes on one line: the HTTP client's top-level messages say little.
pub(crate) fn error_chain(err: &dyn StdError) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}
