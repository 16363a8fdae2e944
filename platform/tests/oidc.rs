//! Signing in with OpenID Connect against a fake provider: an axum server on a loopback port
//! serving discovery, JWKS, token and userinfo, whose answers each test sets. The test plays
//! the browser: it follows `begin`'s authorization URL to the fake provider's "consent", which
//! records the nonce and PKCE challenge and hands back a code, then calls `finish`.
#![allow(clippy::expect_used, clippy::unwrap_used)] // a failed setup step stops the test with its message

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use base64::prelude::{BASE64_STANDARD, BASE64_URL_SAFE_NO_PAD};
use berth_platform::identity::oidc::{
    Callback, Client, IdTokenProblem, Identity, OidcError, PendingLogin, ProviderConfig, Reach,
};
use openidconnect::core::{CoreHmacKey, CoreJsonWebKey, CoreJwsSigningAlgorithm, CoreRsaPrivateSigningKey};
use openidconnect::{
    AccessToken, AccessTokenHash, JsonWebKeyId, PkceCodeChallenge, PkceCodeVerifier, PrivateSigningKey,
};
use serde_json::{Map, Value, json};

const CLIENT_ID: &str = "berth";
const CLIENT_SECRET: &str = "berth-client-secret";
const REDIRECT_URL: &str = "http://127.0.0.1:3000/auth/oidc/callback";
const SUBJECT: &str = "user-42";

const KEY_A: &str = include_str!("fixtures/provider-a.pem");
const KEY_B: &str = include_str!("fixtures/provider-b.pem");
const ATTACKER_KEY: &str = include_str!("fixtures/attacker.pem");

fn rsa_key(pem: &str, kid: &str) -> Arc<CoreRsaPrivateSigningKey> {
    Arc::new(CoreRsaPrivateSigningKey::from_pem(pem, Some(JsonWebKeyId::new(kid.into()))).expect("PEM fixture"))
}

/// RS256 with `key`, naming `kid` in the header.
fn rs256(key: Arc<CoreRsaPrivateSigningKey>, kid: &str) -> Signer {
    Signer::Rsa { key, kid: kid.into(), alg: CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256 }
}

/// How the fake provider signs ID tokens.
#[derive(Clone)]
enum Signer {
    /// An RSA algorithm with this key, naming `kid` in the header.
    Rsa { key: Arc<CoreRsaPrivateSigningKey>, kid: String, alg: CoreJwsSigningAlgorithm },
    /// HS256 with this secret.
    Hmac(Vec<u8>),
    /// `alg: none`, no signature.
    Unsigned,
}

type ClaimsEdit = Box<dyn Fn(&mut Map<String, Value>) + Send>;

/// Everything a test may change about the provider, between or before logins.
struct Behaviour {
    discovery_issuer: Option<String>,
    iss_parameter_supported: bool,
    scopes_supported: Vec<&'static str>,
    algs_supported: Vec<&'static str>,
    /// Some: the provider has a userinfo endpoint answering these claims (`sub` defaults to
    /// the signed-in user's).
    userinfo: Option<Map<String, Value>>,
    /// What `/jwks` publishes.
    published: Vec<CoreJsonWebKey>,
    signer: Signer,
    /// Applied to the ID token's claims last, after `at_hash` is computed.
    edit_claims: ClaimsEdit,
}

struct IssuedCode {
    nonce: String,
    challenge: String,
    used: bool,
}

#[derive(Default)]
struct Counters {
    jwks_fetches: usize,
    token_requests: usize,
    userinfo_requests: usize,
}

struct ProviderState {
    issuer: String,
    behaviour: Behaviour,
    codes: HashMap<String, IssuedCode>,
    access_tokens: HashSet<String>,
    counters: Counters,
    next: u64,
}

type Shared = Arc<Mutex<ProviderState>>;

struct FakeProvider {
    issuer: String,
    state: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeProvider {
    /// A provider signing with key A (kid `a`) and publishing it, with groups and userinfo.
    async fn start() -> FakeProvider {
        let key = rsa_key(KEY_A, "a");
        let behaviour = Behaviour {
            discovery_issuer: None,
            iss_parameter_supported: false,
            scopes_supported: vec!["openid", "email", "profile", "groups"],
            algs_supported: vec!["RS256"],
            userinfo: Some(Map::new()),
            published: vec![key.as_verification_key()],
            signer: rs256(key, "a"),
            edit_claims: Box::new(|_| {}),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let issuer = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(ProviderState {
            issuer: issuer.clone(),
            behaviour,
            codes: HashMap::new(),
            access_tokens: HashSet::new(),
            counters: Counters::default(),
            next: 0,
        }));
        let app = Router::new()
            .route("/.well-known/openid-configuration", get(discovery))
            .route("/jwks", get(jwks))
            .route("/token", post(token))
            .route("/userinfo", get(userinfo))
            .with_state(state.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake provider");
        });
        FakeProvider { issuer, state, server }
    }

    fn set(&self, change: impl FnOnce(&mut Behaviour)) {
        change(&mut self.state.lock().unwrap().behaviour);
    }

    fn edit_claims(&self, edit: impl Fn(&mut Map<String, Value>) + Send + 'static) {
        self.set(|b| b.edit_claims = Box::new(edit));
    }

    fn counters(&self) -> (usize, usize, usize) {
        let s = self.state.lock().unwrap();
        (s.counters.jwks_fetches, s.counters.token_requests, s.counters.userinfo_requests)
    }

    fn config(&self) -> ProviderConfig {
        ProviderConfig {
            issuer: self.issuer.clone(),
            client_id: CLIENT_ID.into(),
            client_secret: Some(CLIENT_SECRET.into()),
            redirect_url: REDIRECT_URL.into(),
            groups_claim: "groups".into(),
            // The test provider listens on loopback.
            reach: Reach::Private,
        }
    }

    async fn client(&self) -> Client {
        Client::discover(self.config()).await.expect("discovery")
    }

    /// The provider's authorization endpoint after the user consents: checks the request,
    /// remembers its nonce and PKCE challenge, and answers with the callback the browser
    /// would bring back.
    fn authorize(&self, authorization_url: &str) -> Callback {
        let url = reqwest::Url::parse(authorization_url).expect("authorization URL");
        let query: HashMap<String, String> = url.query_pairs().into_owned().collect();
        assert_eq!(url.path(), "/authorize");
        assert_eq!(query["response_type"], "code");
        assert_eq!(query["client_id"], CLIENT_ID);
        assert_eq!(query["redirect_uri"], REDIRECT_URL);
        assert_eq!(query["code_challenge_method"], "S256");
        let mut s = self.state.lock().unwrap();
        s.next += 1;
        let code = format!("code-{}", s.next);
        let issued =
            IssuedCode { nonce: query["nonce"].clone(), challenge: query["code_challenge"].clone(), used: false };
        s.codes.insert(code.clone(), issued);
        Callback { code, state: query["state"].clone(), iss: Some(s.issuer.clone()) }
    }

    /// A whole login: begin, consent, finish.
    async fn sign_in(&self, client: &Client) -> Result<Identity, OidcError> {
        let (url, pending) = client.begin();
        let callback = self.authorize(&url);
        client.finish(&pending, &callback).await
    }
}

async fn discovery(State(state): State<Shared>) -> Json<Value> {
    let s = state.lock().unwrap();
    let b = &s.behaviour;
    let base = &s.issuer;
    let mut doc = json!({
        "issuer": b.discovery_issuer.clone().unwrap_or_else(|| base.clone()),
        "authorization_endpoint": format!("{base}/authorize"),
        "token_endpoint": format!("{base}/token"),
        "jwks_uri": format!("{base}/jwks"),
        "response_types_supported": ["code"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": b.algs_supported,
        "scopes_supported": b.scopes_supported,
        "code_challenge_methods_supported": ["S256"],
        "authorization_response_iss_parameter_supported": b.iss_parameter_supported,
    });
    if b.userinfo.is_some() {
        doc["userinfo_endpoint"] = json!(format!("{base}/userinfo"));
    }
    Json(doc)
}

async fn jwks(State(state): State<Shared>) -> Json<Value> {
    let mut s = state.lock().unwrap();
    s.counters.jwks_fetches += 1;
    Json(json!({ "keys": s.behaviour.published }))
}

fn oauth_error(error: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": error }))).into_response()
}

async fn token(State(state): State<Shared>, headers: HeaderMap, Form(form): Form<HashMap<String, String>>) -> Response {
    let mut s = state.lock().unwrap();
    s.counters.token_requests += 1;
    let basic = format!("Basic {}", BASE64_STANDARD.encode(format!("{CLIENT_ID}:{CLIENT_SECRET}")));
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(basic.as_str()) {
        return oauth_error("invalid_client");
    }
    if form.get("grant_type").map(String::as_str) != Some("authorization_code")
        || form.get("redirect_uri").map(String::as_str) != Some(REDIRECT_URL)
    {
        return oauth_error("invalid_request");
    }
    let code = form.get("code").cloned().unwrap_or_default();
    let verifier = PkceCodeVerifier::new(form.get("code_verifier").cloned().unwrap_or_default());
    let Some(issued) = s.codes.get_mut(&code) else { return oauth_error("invalid_grant") };
    // A code is good for one exchange only, and only with the verifier of its challenge.
    if issued.used || PkceCodeChallenge::from_code_verifier_sha256(&verifier).as_str() != issued.challenge {
        return oauth_error("invalid_grant");
    }
    issued.used = true;
    let nonce = issued.nonce.clone();

    s.next += 1;
    let access_token = format!("access-{}", s.next);
    s.access_tokens.insert(access_token.clone());
    let id_token = id_token(&s.issuer, &s.behaviour, &nonce, &access_token);
    Json(json!({
        "access_token": access_token,
        "token_type": "Bearer",
        "expires_in": 300,
        "id_token": id_token,
    }))
    .into_response()
}

fn id_token(issuer: &str, b: &Behaviour, nonce: &str, access_token: &str) -> String {
    let now = chrono::Utc::now().timestamp();
    let mut claims = json!({
        "iss": issuer,
        "aud": CLIENT_ID,
        "sub": SUBJECT,
        "nonce": nonce,
        "iat": now,
        "exp": now + 300,
        "email": "ada@example.org",
        "email_verified": true,
        "name": "Ada Lovelace",
        "groups": ["gpu-users", "tenant-a-admins"],
    })
    .as_object()
    .cloned()
    .unwrap();
    let (alg, kid) = match &b.signer {
        Signer::Rsa { key, kid, alg } => {
            let hash =
                AccessTokenHash::from_token(&AccessToken::new(access_token.into()), alg, &key.as_verification_key())
                    .unwrap();
            claims.insert("at_hash".into(), json!(hash.as_str()));
            (serde_json::to_value(alg).unwrap(), Some(kid.clone()))
        }
        Signer::Hmac(_) => (json!("HS256"), None),
        Signer::Unsigned => (json!("none"), None),
    };
    (b.edit_claims)(&mut claims);

    let mut header = json!({ "alg": alg, "typ": "JWT" });
    if let Some(kid) = kid {
        header["kid"] = json!(kid);
    }
    let signing_input = format!(
        "{}.{}",
        BASE64_URL_SAFE_NO_PAD.encode(header.to_string()),
        BASE64_URL_SAFE_NO_PAD.encode(Value::Object(claims).to_string())
    );
    let signature = match &b.signer {
        Signer::Rsa { key, alg, .. } => key.sign(alg, signing_input.as_bytes()).unwrap(),
        Signer::Hmac(secret) => CoreHmacKey::new(secret.clone())
            .sign(&CoreJwsSigningAlgorithm::HmacSha256, signing_input.as_bytes())
            .unwrap(),
        Signer::Unsigned => Vec::new(),
    };
    format!("{signing_input}.{}", BASE64_URL_SAFE_NO_PAD.encode(signature))
}

async fn userinfo(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let mut s = state.lock().unwrap();
    s.counters.userinfo_requests += 1;
    let bearer = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if !bearer.is_some_and(|token| s.access_tokens.contains(token)) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let Some(claims) = s.behaviour.userinfo.clone() else { return StatusCode::NOT_FOUND.into_response() };
    let mut claims = claims;
    claims.entry("sub").or_insert(json!(SUBJECT));
    Json(Value::Object(claims)).into_response()
}

#[track_caller]
fn assert_id_token_problem(result: Result<Identity, OidcError>, expected: IdTokenProblem) {
    match result {
        Err(OidcError::IdTokenInvalid { problem, .. }) if problem == expected => {}
        other => panic!("expected an ID token refused for {expected:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn happy_path_returns_subject_verified_email_and_groups() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;

    let (url, pending) = client.begin();
    let query: HashMap<String, String> = reqwest::Url::parse(&url).unwrap().query_pairs().into_owned().collect();
    let scopes: HashSet<&str> = query["scope"].split(' ').collect();
    assert_eq!(scopes, HashSet::from(["openid", "email", "profile", "groups"]));
    assert_eq!(query["state"], pending.state);
    assert_eq!(query["nonce"], pending.nonce);
    let (_, other) = client.begin();
    assert_ne!(other.state, pending.state, "state is random per login");
    assert_ne!(other.nonce, pending.nonce, "nonce is random per login");
    assert_ne!(other.pkce_verifier, pending.pkce_verifier);

    let callback = provider.authorize(&url);
    let identity = client.finish(&pending, &callback).await.expect("sign in");
    assert_eq!(
        identity,
        Identity {
            issuer: provider.issuer.clone(),
            subject: SUBJECT.into(),
            email: Some("ada@example.org".into()),
            name: Some("Ada Lovelace".into()),
            groups: vec!["gpu-users".into(), "tenant-a-admins".into()],
        }
    );
    let (_, tokens, userinfo) = provider.counters();
    assert_eq!((tokens, userinfo), (1, 0), "groups were in the ID token, so no userinfo call");
}

#[tokio::test]
async fn pending_login_survives_a_round_trip_through_storage() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    let (url, pending) = client.begin();
    let stored = serde_json::to_string(&pending).expect("serialize");
    let restored: PendingLogin = serde_json::from_str(&stored).expect("deserialize");
    let callback = provider.authorize(&url);
    assert_eq!(client.finish(&restored, &callback).await.expect("sign in").subject, SUBJECT);
}

#[tokio::test]
async fn groups_scope_is_requested_only_when_advertised() {
    let provider = FakeProvider::start().await;
    provider.set(|b| b.scopes_supported = vec!["openid", "email", "profile"]);
    let client = provider.client().await;
    let (url, _) = client.begin();
    let query: HashMap<String, String> = reqwest::Url::parse(&url).unwrap().query_pairs().into_owned().collect();
    let scopes: HashSet<&str> = query["scope"].split(' ').collect();
    assert_eq!(scopes, HashSet::from(["openid", "email", "profile"]));
}

#[tokio::test]
async fn discovery_refuses_a_document_naming_another_issuer() {
    let provider = FakeProvider::start().await;
    provider.set(|b| b.discovery_issuer = Some("https://evil.example".into()));
    match Client::discover(provider.config()).await {
        Err(OidcError::IssuerMismatch(_)) => {}
        Err(other) => panic!("expected IssuerMismatch, got {other:?}"),
        Ok(_) => panic!("expected IssuerMismatch, discovery succeeded"),
    }
    // A trailing slash is a different issuer too: the comparison is exact.
    provider.set(|b| b.discovery_issuer = None);
    let mut config = provider.config();
    config.issuer.push('/');
    assert!(matches!(Client::discover(config).await, Err(OidcError::IssuerMismatch(_))));
}

#[tokio::test]
async fn discovery_refuses_a_provider_signing_only_with_hmac() {
    let provider = FakeProvider::start().await;
    provider.set(|b| b.algs_supported = vec!["HS256"]);
    assert!(matches!(Client::discover(provider.config()).await, Err(OidcError::Discovery(_))));
}

#[tokio::test]
async fn token_from_another_issuer_is_refused() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    provider.edit_claims(|c| {
        c.insert("iss".into(), json!("https://other-idp.example"));
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::Issuer);
}

#[tokio::test]
async fn token_for_another_client_is_refused() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    provider.edit_claims(|c| {
        c.insert("aud".into(), json!("someone-else"));
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::Audience);
}

#[tokio::test]
async fn several_audiences_need_azp_naming_us() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;

    provider.edit_claims(|c| {
        c.insert("aud".into(), json!([CLIENT_ID, "other-app"]));
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::AuthorizedParty);

    provider.edit_claims(|c| {
        c.insert("aud".into(), json!([CLIENT_ID, "other-app"]));
        c.insert("azp".into(), json!("other-app"));
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::AuthorizedParty);

    provider.edit_claims(|c| {
        c.insert("aud".into(), json!([CLIENT_ID, "other-app"]));
        c.insert("azp".into(), json!(CLIENT_ID));
    });
    assert_eq!(provider.sign_in(&client).await.expect("azp names us").subject, SUBJECT);
}

#[tokio::test]
async fn token_without_subject_is_refused() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    provider.edit_claims(|c| {
        c.remove("sub");
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::MissingSubject);

    provider.edit_claims(|c| {
        c.insert("sub".into(), json!(""));
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::MissingSubject);
}

#[tokio::test]
async fn token_with_another_logins_nonce_is_refused() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    provider.edit_claims(|c| {
        c.insert("nonce".into(), json!("nonce-of-an-earlier-login"));
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::Nonce);

    provider.edit_claims(|c| {
        c.remove("nonce");
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::Nonce);
}

#[tokio::test]
async fn expired_token_is_refused() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    provider.edit_claims(|c| {
        let now = chrono::Utc::now().timestamp();
        c.insert("iat".into(), json!(now - 600));
        c.insert("exp".into(), json!(now - 300));
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::Expired);
}

#[tokio::test]
async fn token_issued_in_the_future_or_long_ago_is_refused() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    provider.edit_claims(|c| {
        let now = chrono::Utc::now().timestamp();
        c.insert("iat".into(), json!(now + 3600));
        c.insert("exp".into(), json!(now + 7200));
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::IssuedAt);

    provider.edit_claims(|c| {
        let now = chrono::Utc::now().timestamp();
        c.insert("iat".into(), json!(now - 86_400));
        c.insert("exp".into(), json!(now + 3600));
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::IssuedAt);
}

#[tokio::test]
async fn token_signed_by_another_key_under_the_providers_kid_is_refused() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    provider.set(|b| b.signer = rs256(rsa_key(ATTACKER_KEY, "a"), "a"));
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::Signature);
}

#[tokio::test]
async fn unsigned_token_is_refused() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    provider.set(|b| b.signer = Signer::Unsigned);
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::Algorithm);
}

#[tokio::test]
async fn algorithm_the_provider_does_not_advertise_is_refused() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    provider.set(|b| {
        b.signer = Signer::Rsa {
            key: rsa_key(KEY_A, "a"),
            kid: "a".into(),
            alg: CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha512,
        }
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::Algorithm);

    // The same key and algorithm are fine once the provider lists RS512.
    provider.set(|b| b.algs_supported = vec!["RS256", "RS512"]);
    let client = provider.client().await;
    assert_eq!(provider.sign_in(&client).await.expect("RS512 advertised").subject, SUBJECT);
}

#[tokio::test]
async fn hmac_token_is_refused_even_keyed_with_the_client_secret() {
    let provider = FakeProvider::start().await;
    // Even a provider that advertises HS256 does not get it: the client secret is not a
    // signing key Berth trusts for identities.
    provider.set(|b| b.algs_supported = vec!["RS256", "HS256"]);
    let client = provider.client().await;
    provider.set(|b| b.signer = Signer::Hmac(CLIENT_SECRET.as_bytes().to_vec()));
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::Algorithm);

    // The classic confusion: HMAC keyed with the provider's public key.
    let public_key = serde_json::to_vec(&rsa_key(KEY_A, "a").as_verification_key()).unwrap();
    provider.set(|b| b.signer = Signer::Hmac(public_key));
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::Algorithm);
}

#[tokio::test]
async fn at_hash_must_match_the_access_token() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    provider.edit_claims(|c| {
        c.insert("at_hash".into(), json!("bm90LXRoZS1yaWdodC1oYXNo"));
    });
    assert_id_token_problem(provider.sign_in(&client).await, IdTokenProblem::AccessTokenHash);

    // Absent is fine: at_hash is optional in the code flow.
    provider.edit_claims(|c| {
        c.remove("at_hash");
    });
    assert_eq!(provider.sign_in(&client).await.expect("no at_hash").subject, SUBJECT);
}

#[tokio::test]
async fn unknown_kid_refetches_once_then_fails_and_refetches_are_rate_limited() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    assert_eq!(provider.counters().0, 1, "discovery fetched the JWKS");
    provider.set(|b| b.signer = rs256(rsa_key(KEY_B, "b"), "b"));

    match provider.sign_in(&client).await {
        Err(OidcError::UnknownKeyId { kid }) => assert_eq!(kid.as_deref(), Some("b")),
        other => panic!("expected UnknownKeyId, got {other:?}"),
    }
    assert_eq!(provider.counters().0, 2, "one refetch for the unknown kid");

    // A second forged kid right after: refused without another fetch, from any clone.
    let clone = client.clone();
    assert!(matches!(provider.sign_in(&clone).await, Err(OidcError::UnknownKeyId { .. })));
    assert_eq!(provider.counters().0, 2, "refetches are rate limited");
}

#[tokio::test]
async fn keys_rotate_between_two_logins_without_a_restart() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    assert_eq!(provider.sign_in(&client).await.expect("first login with key a").subject, SUBJECT);

    let key_b = rsa_key(KEY_B, "b");
    provider.set(|b| {
        b.published = vec![key_b.as_verification_key()];
        b.signer = rs256(key_b.clone(), "b");
    });
    // A clone shares the refreshed key set: the next login through it needs no fetch.
    let clone = client.clone();
    assert_eq!(provider.sign_in(&clone).await.expect("second login with key b").subject, SUBJECT);
    assert_eq!(provider.counters().0, 2, "discovery plus one refetch");
    assert_eq!(provider.sign_in(&client).await.expect("third login with key b").subject, SUBJECT);
    assert_eq!(provider.counters().0, 2, "the refreshed keys are shared by every clone");
}

#[tokio::test]
async fn callback_with_another_state_is_refused_before_the_code_is_spent() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    let (url, pending) = client.begin();
    let (_, other_login) = client.begin();
    let callback = provider.authorize(&url);

    let result = client.finish(&other_login, &callback).await;
    assert!(matches!(result, Err(OidcError::StateMismatch)), "got {result:?}");
    assert_eq!(provider.counters().1, 0, "no token request for a foreign callback");
    // The rightful login can still finish.
    assert_eq!(client.finish(&pending, &callback).await.expect("own login").subject, SUBJECT);
}

#[tokio::test]
async fn callback_iss_parameter_must_name_the_issuer() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    let (url, pending) = client.begin();
    let mut callback = provider.authorize(&url);
    callback.iss = Some("https://mix-up.example".into());
    let result = client.finish(&pending, &callback).await;
    assert!(
        matches!(&result, Err(OidcError::IssParameterMismatch { received }) if received == "https://mix-up.example"),
        "got {result:?}"
    );

    // Without the parameter, a provider that never promised it is fine.
    callback.iss = None;
    assert_eq!(client.finish(&pending, &callback).await.expect("no iss").subject, SUBJECT);
    assert_eq!(provider.counters().1, 1);
}

#[tokio::test]
async fn callback_without_iss_is_refused_when_the_provider_promises_it() {
    let provider = FakeProvider::start().await;
    provider.set(|b| b.iss_parameter_supported = true);
    let client = provider.client().await;
    let (url, pending) = client.begin();
    let mut callback = provider.authorize(&url);
    callback.iss = None;
    let result = client.finish(&pending, &callback).await;
    assert!(matches!(result, Err(OidcError::IssParameterMissing)), "got {result:?}");
    assert_eq!(provider.counters().1, 0);
}

#[tokio::test]
async fn replayed_code_is_refused() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    let (url, pending) = client.begin();
    let callback = provider.authorize(&url);
    client.finish(&pending, &callback).await.expect("first use");

    let result = client.finish(&pending, &callback).await;
    match &result {
        Err(err @ OidcError::CodeRejected { error }) => {
            assert!(error.starts_with("invalid_grant"), "{error}");
            assert!(!err.to_string().contains(&callback.code), "the code stays out of logs");
        }
        other => panic!("expected CodeRejected, got {other:?}"),
    }
}

#[tokio::test]
async fn code_with_another_logins_pkce_verifier_is_refused() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    let (url, pending) = client.begin();
    let callback = provider.authorize(&url);
    let (_, other) = client.begin();
    let tampered = PendingLogin { pkce_verifier: other.pkce_verifier, ..pending };
    let result = client.finish(&tampered, &callback).await;
    assert!(matches!(result, Err(OidcError::CodeRejected { .. })), "got {result:?}");
}

#[tokio::test]
async fn groups_come_from_userinfo_when_the_id_token_lacks_them() {
    let provider = FakeProvider::start().await;
    provider.set(|b| {
        b.userinfo = Some(
            json!({ "groups": "gpu-users", "email": "ada@example.org", "email_verified": true })
                .as_object()
                .cloned()
                .unwrap(),
        )
    });
    let client = provider.client().await;
    provider.edit_claims(|c| {
        c.remove("groups");
        c.remove("email");
        c.remove("email_verified");
    });
    let identity = provider.sign_in(&client).await.expect("sign in");
    assert_eq!(identity.groups, vec!["gpu-users".to_string()], "a single string is one group");
    assert_eq!(identity.email.as_deref(), Some("ada@example.org"));
    assert_eq!(identity.name.as_deref(), Some("Ada Lovelace"));
    assert_eq!(provider.counters().2, 1);
}

#[tokio::test]
async fn userinfo_for_another_subject_is_refused() {
    let provider = FakeProvider::start().await;
    provider
        .set(|b| b.userinfo = Some(json!({ "sub": "user-666", "groups": ["admins"] }).as_object().cloned().unwrap()));
    let client = provider.client().await;
    provider.edit_claims(|c| {
        c.remove("groups");
    });
    let result = provider.sign_in(&client).await;
    assert!(matches!(result, Err(OidcError::UserInfoSubjectMismatch)), "got {result:?}");
}

#[tokio::test]
async fn no_userinfo_endpoint_means_no_groups() {
    let provider = FakeProvider::start().await;
    provider.set(|b| b.userinfo = None);
    let client = provider.client().await;
    provider.edit_claims(|c| {
        c.remove("groups");
    });
    assert_eq!(provider.sign_in(&client).await.expect("sign in").groups, Vec::<String>::new());
}

#[tokio::test]
async fn unverified_email_is_dropped() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    provider.edit_claims(|c| {
        c.insert("email_verified".into(), json!(false));
    });
    let identity = provider.sign_in(&client).await.expect("sign in");
    assert_eq!((identity.subject.as_str(), identity.email), (SUBJECT, None));

    provider.edit_claims(|c| {
        c.remove("email_verified");
    });
    assert_eq!(provider.sign_in(&client).await.expect("sign in").email, None, "unstated is not verified");
}

#[tokio::test]
async fn secrets_stay_out_of_debug_output() {
    let provider = FakeProvider::start().await;
    let client = provider.client().await;
    let (url, pending) = client.begin();
    let callback = provider.authorize(&url);
    let shown = format!("{pending:?} {callback:?} {:?}", provider.config());
    for secret in [&pending.nonce, &pending.pkce_verifier, &pending.state, &callback.code, &CLIENT_SECRET.to_string()] {
        assert!(!shown.contains(secret.as_str()), "{shown}");
    }
}
