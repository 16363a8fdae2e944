//! The HTTP client for calls to identity providers: discovery, keys, token and userinfo.
//!
//! A tenant admin chooses the issuer, and the provider's discovery document names the
//! other URLs, so every request is checked as it goes out, not only when the issuer is
//! saved: the URL's scheme and host (see `berth_domain::outbound`), and, for a host name,
//! every address it resolves to at that moment, so a name that resolved to a public
//! address at save and to a private one later (DNS rebinding) is still refused. Redirects
//! are not followed, answers are cut off at [`MAX_BODY_BYTES`] and take at most
//! [`TIMEOUT`].

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use berth_domain::outbound::{self, Reach, Unreachable};
use openidconnect::{AsyncHttpClient, HttpClientError, HttpRequest, HttpResponse};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// How long one call to a provider may take, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read from a provider (discovery documents and key sets are a few KiB).
pub const MAX_BODY_BYTES: usize = 512 * 1024;

type Failure = HttpClientError<reqwest::Error>;

#[derive(Clone)]
pub struct ProviderHttp {
    client: reqwest::Client,
    reach: Reach,
}

impl ProviderHttp {
    pub fn new(reach: Reach) -> Result<ProviderHttp, reqwest::Error> {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT);
        if reach == Reach::Public {
            builder = builder.dns_resolver(Arc::new(PublicOnly));
        }
        Ok(ProviderHttp { client: builder.build()?, reach })
    }

    async fn fetch(&self, request: HttpRequest) -> Result<HttpResponse, Failure> {
        let url = request.uri().to_string();
        match outbound::check_url(&url, self.reach) {
            Ok(()) => {}
            Err(Unreachable::Scheme) => {
                return Err(HttpClientError::Other(format!("{url}: only https URLs are fetched from a provider")));
            }
            Err(Unreachable::PrivateAddress(host)) => {
                return Err(HttpClientError::Other(format!("{url}: {host} is not a public address")));
            }
        }
        let request = reqwest::Request::try_from(request).map_err(Box::new)?;
        let mut response = self.client.execute(request).await.map_err(Box::new)?;
        if response.content_length().is_some_and(|length| length > MAX_BODY_BYTES as u64) {
            return Err(too_large(&url));
        }
        let mut builder =
            openidconnect::http::Response::builder().status(response.status()).version(response.version());
        for (name, value) in response.headers() {
            builder = builder.header(name, value);
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(Box::new)? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(too_large(&url));
            }
            body.extend_from_slice(&chunk);
        }
        builder.body(body).map_err(HttpClientError::Http)
    }
}

fn too_large(url: &str) -> Failure {
    HttpClientError::Other(format!("{url}: the answer is larger than {} KiB", MAX_BODY_BYTES / 1024))
}

impl<'c> AsyncHttpClient<'c> for ProviderHttp {
    type Error = Failure;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, Failure>> + Send + 'c>>;

    fn call(&'c self, request: HttpRequest) -> Self::Future {
        Box::pin(self.fetch(request))
    }
}

/// Resolves a host name and refuses it when any of its addresses is not public: one
/// private address among public ones would be tried too.
struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some(private) = addresses.iter().find(|a| !outbound::is_public(a.ip())) {
                let why = format!("{host} resolves to {}, which is not a public address", private.ip());
                return Err(why.into());
            }
            let addresses: Addrs = Box::new(addresses.into_iter());
            Ok(addresses)
        })
    }
}

/// What a host name resolves to now, as the client would judge it.
#[derive(Debug, PartialEq, Eq)]
pub enum Resolved {
    Public,
    /// One of its addresses is not public.
    Private(std::net::IpAddr),
    /// No address, or no answer.
    Nothing,
}

/// Resolves `host` as the client does at every call: for checking an issuer when it is saved.
pub async fn resolve(host: &str) -> Resolved {
    let Ok(addresses) = tokio::net::lookup_host((host, 443)).await else { return Resolved::Nothing };
    let addresses: Vec<SocketAddr> = addresses.collect();
    match addresses.iter().find(|a| !outbound::is_public(a.ip())) {
        Some(private) => Resolved::Private(private.ip()),
        None if addresses.is_empty() => Resolved::Nothing,
        None => Resolved::Public,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(url: &str) -> HttpRequest {
        openidconnect::http::Request::get(url).body(Vec::new()).expect("request")
    }

    #[tokio::test]
    async fn a_public_only_client_refuses_private_and_loopback_targets_before_connecting() {
        // Something listens on loopback, so a refusal is the check's, not a closed port's.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let http = ProviderHttp::new(Reach::Public).expect("client");
        for url in [
            format!("https://127.0.0.1:{port}/.well-known/openid-configuration"),
            format!("http://127.0.0.1:{port}/"),
            format!("https://localhost:{port}/"),
            "https://169.254.169.254/latest/meta-data".to_owned(),
            "https://[::ffff:127.0.0.1]/".to_owned(),
        ] {
            let error = http.call(get(&url)).await.expect_err("refused");
            assert!(
                error.to_string().contains("public address") || error.to_string().contains("https"),
                "{url}: {error}"
            );
        }
    }

    #[tokio::test]
    async fn names_are_refused_when_they_resolve_to_a_private_address() {
        use std::str::FromStr;
        // What a name looks like does not matter: what it resolves to, at each call.
        let refused = PublicOnly.resolve(Name::from_str("localhost").expect("name")).await;
        let why = refused.err().expect("refused").to_string();
        assert!(why.contains("not a public address"), "{why}");
        assert!(matches!(resolve("localhost").await, Resolved::Private(_)));
    }

    #[tokio::test]
    async fn answers_are_cut_off_at_the_limit() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            // Chunked, no length up front: the limit must hold while reading.
            let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").await;
            let chunk = vec![b'x'; 64 * 1024];
            for _ in 0..16 {
                let _ = socket.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await;
                let _ = socket.write_all(&chunk).await;
                let _ = socket.write_all(b"\r\n").await;
            }
        });
        let http = ProviderHttp::new(Reach::Private).expect("client");
        let error = http.call(get(&format!("http://127.0.0.1:{port}/jwks"))).await.expect_err("too large");
        assert!(error.to_string().contains("larger than"), "{error}");
    }
}
