//! The site's files: `/pkg/*` (the hydration script, the WebAssembly, the styles) and
//! `public/`'s files, and how caches may keep them.
//!
//! A release site (`make release`) names its `/pkg` files by their content's hash, lists the
//! hashes in `hash.txt` (the format Leptos reads: `js: …`, `wasm: …`, `css: …`) and keeps
//! brotli and gzip copies beside each file. Such a name never changes content, so browsers
//! keep it a year without asking again; every other file (a development build's, the
//! favicon) carries an ETag and is asked again each time, answered 304 while unchanged.

use std::path::{Path, PathBuf};

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use sha2::{Digest, Sha256};
use tower_http::services::ServeDir;

/// Written by `make release` beside `pkg/`: the content hashes in the files' names.
pub const HASH_FILE: &str = "hash.txt";

const IMMUTABLE: HeaderValue = HeaderValue::from_static("public, max-age=31536000, immutable");
const REVALIDATE: HeaderValue = HeaderValue::from_static("no-cache");

/// The hash file of a release site, as an absolute path (Leptos joins it to the binary's
/// folder, which an absolute path replaces); `None` for a development site.
pub fn hash_file(site_root: &str) -> Option<PathBuf> {
    let path = Path::new(site_root).join(HASH_FILE);
    path.is_file().then(|| std::fs::canonicalize(&path).unwrap_or(path))
}

/// `/pkg/*` from the site: the `.br` or `.gz` copy where the browser accepts it and one
/// exists, the file itself otherwise.
pub fn pkg(site_root: &str) -> ServeDir {
    ServeDir::new(Path::new(site_root).join("pkg")).precompressed_br().precompressed_gzip()
}

/// Whether a file's name carries its content's hash (`berth.1a2b…9f.wasm`): a part of at
/// least 16 hexadecimal digits between dots.
fn is_hashed(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.split('.').skip(1).any(|part| part.len() >= 16 && part.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What caches may do with a response: a site file is kept (`immutable` for a hashed name,
/// revalidated by its ETag otherwise); anything else (pages, server functions' and the API's
/// answers, downloads) depends on who asks, and no cache keeps it.
pub async fn cache_policy(mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    // If-None-Match wins over If-Modified-Since (RFC 9110 13.2.2): the file service must
    // not answer 304 on the date alone when the ETag is what the browser compares.
    let if_none_match = request.headers_mut().remove(header::IF_NONE_MATCH);
    if if_none_match.is_some() {
        request.headers_mut().remove(header::IF_MODIFIED_SINCE);
    }
    let mut response = next.run(request).await;
    if !is_site_file(response.headers()) {
        response.headers_mut().entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
        return response;
    }
    // The same address answers brotli, gzip or the plain file by what the browser accepts.
    response.headers_mut().entry(header::VARY).or_insert(HeaderValue::from_static("accept-encoding"));
    if is_hashed(&path) && response.status().is_success() {
        response.headers_mut().insert(header::CACHE_CONTROL, IMMUTABLE);
        return response;
    }
    response.headers_mut().insert(header::CACHE_CONTROL, REVALIDATE);
    let Some(etag) = etag(response.headers()) else { return response };
    if response.status() == StatusCode::OK && if_none_match.as_ref().is_some_and(|asked| matches(asked, &etag)) {
        let mut not_modified = StatusCode::NOT_MODIFIED.into_response();
        for name in [header::CACHE_CONTROL, header::LAST_MODIFIED, header::VARY, header::CONTENT_ENCODING] {
            if let Some(value) = response.headers().get(&name) {
                not_modified.headers_mut().insert(name, value.clone());
            }
        }
        not_modified.headers_mut().insert(header::ETAG, etag);
        return not_modified;
    }
    response.headers_mut().insert(header::ETAG, etag);
    response
}

/// A file from the site folder: the file service dates it; nothing else Berth answers does.
fn is_site_file(headers: &HeaderMap) -> bool {
    headers.contains_key(header::LAST_MODIFIED)
}

/// A strong validator for one representation of a file: its date, length and encoding (the
/// brotli copy and the plain file are different representations).
fn etag(headers: &HeaderMap) -> Option<HeaderValue> {
    headers.get(header::LAST_MODIFIED)?;
    let mut digest = Sha256::new();
    for name in [header::LAST_MODIFIED, header::CONTENT_LENGTH, header::CONTENT_ENCODING] {
        digest.update(headers.get(&name).map(HeaderValue::as_bytes).unwrap_or_default());
        digest.update([0]);
    }
    let hex: String = digest.finalize().iter().take(10).map(|byte| format!("{byte:02x}")).collect();
    HeaderValue::from_str(&format!("\"{hex}\"")).ok()
}

/// `If-None-Match: "a", "b"` or `*` against one ETag (weak comparison, as RFC 9110 asks for
/// this header).
fn matches(asked: &HeaderValue, etag: &HeaderValue) -> bool {
    let Ok(asked) = asked.to_str() else { return false };
    let ours = etag.to_str().unwrap_or_default();
    asked.split(',').map(str::trim).any(|tag| tag == "*" || tag.trim_start_matches("W/") == ours)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_names_are_the_ones_with_a_long_hexadecimal_part() {
        assert!(is_hashed("/pkg/berth.0123456789abcdef.wasm"));
        assert!(is_hashed("/pkg/berth.0123456789abcdef0123.css"));
        assert!(!is_hashed("/pkg/berth_bg.wasm"));
        assert!(!is_hashed("/pkg/berth.css"));
        assert!(!is_hashed("/favicon.svg"));
        assert!(!is_hashed("/pkg/berth.0123456789abcdeg.js"));
    }

    #[test]
    fn if_none_match_lists_and_weak_tags_match() {
        let ours = HeaderValue::from_static("\"abc\"");
        for asked in ["\"abc\"", "\"x\", \"abc\"", "W/\"abc\"", "*"] {
            assert!(matches(&HeaderValue::from_static(asked), &ours), "{asked}");
        }
        assert!(!matches(&HeaderValue::from_static("\"abd\""), &ours));
    }
}
