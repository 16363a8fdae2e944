//! Where a `next` parameter may send a browser: only to a path on Berth's own origin.
//!
//! Browsers clean a URL before they parse it (tabs and newlines anywhere are dropped,
//! leading and trailing controls and spaces trimmed, `\` read as `/`), so a check on the
//! raw text is not enough: `/<TAB>/evil.example` becomes `//evil.example`, another host.
//! Rather than copy that clean-up, anything it would touch is refused, and what is left
//! is resolved as a browser resolves it and must keep the origin.

use url::Url;

use crate::Refusal;

/// Berth serves from the root of its origin, so any origin stands in for the public URL:
/// a reference that keeps this one keeps every one. (`.invalid` never resolves.)
const SOME_ORIGIN: &str = "https://berth.invalid/";

/// `next` as the path, query and fragment it names on this origin, percent-encoded (so
/// it is plain ASCII, fit for a `Location` header), or a refusal.
pub fn local_path(next: &str) -> Result<String, Refusal> {
    let cleaned_by_browsers = |c: char| c.is_control() || c == '\\';
    if !next.starts_with('/') || next.starts_with("//") || next.chars().any(cleaned_by_browsers) {
        return Err(Refusal::NotLocalPath);
    }
    let base = Url::parse(SOME_ORIGIN).map_err(|_| Refusal::NotLocalPath)?;
    let resolved = base.join(next).map_err(|_| Refusal::NotLocalPath)?;
    // Dot segments can leave a path that starts with `//` (`/.//evil.example`), which a
    // browser given it on its own reads as a host.
    if resolved.origin() != base.origin() || resolved.path().starts_with("//") {
        return Err(Refusal::NotLocalPath);
    }
    let mut path = resolved.path().to_owned();
    if let Some(query) = resolved.query() {
        path.push('?');
        path.push_str(query);
    }
    if let Some(fragment) = resolved.fragment() {
        path.push('#');
        path.push_str(fragment);
    }
    Ok(path)
}

/// `next` where one was given (refused if it leaves this origin), `fallback` otherwise.
pub fn next_or(next: Option<&str>, fallback: &str) -> Result<String, Refusal> {
    match next {
        Some(next) if !next.is_empty() => local_path(next),
        _ => Ok(fallback.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_on_this_site_are_kept() {
        assert_eq!(local_path("/launch/notebook").as_deref(), Ok("/launch/notebook"));
        assert_eq!(local_path("/lab?reset").as_deref(), Ok("/lab?reset"));
        assert_eq!(local_path("/environments#top").as_deref(), Ok("/environments#top"));
        assert_eq!(local_path("/a/../b").as_deref(), Ok("/b"));
        // Encoded, so the answer can go in a header as it is.
        assert_eq!(local_path("/notes/ä b").as_deref(), Ok("/notes/%C3%A4%20b"));
        assert_eq!(next_or(None, "/environments").as_deref(), Ok("/environments"));
        assert_eq!(next_or(Some(""), "/").as_deref(), Ok("/"));
    }

    #[test]
    fn anything_a_browser_could_read_as_another_origin_is_refused() {
        for next in [
            "//evil.example",
            "https://evil.example",
            "evil.example",
            "/\\evil.example",
            "\\/evil.example",
            "/\t/evil.example/x",
            "/\n/evil.example",
            "/\r\n/evil.example",
            "\t//evil.example",
            " //evil.example",
            "/.//evil.example",
            "/./\t/evil.example",
            "/x\u{0}y",
            "/x\u{7f}",
            "/x\u{85}",
            "javascript:alert(1)",
            "/\r\nSet-Cookie: a=b",
        ] {
            assert_eq!(local_path(next), Err(Refusal::NotLocalPath), "{next:?}");
            assert_eq!(next_or(Some(next), "/"), Err(Refusal::NotLocalPath), "{next:?}");
        }
    }

    proptest::proptest! {
        /// Whatever is accepted is printable ASCII and stays on the origin, from any base.
        #[test]
        fn what_is_accepted_stays_here(next in "[/\\\\.:a-z \\x00-\\x1f%?#@ä]{0,12}") {
            if let Ok(path) = local_path(&next) {
                proptest::prop_assert!(path.bytes().all(|b| (0x21..0x7f).contains(&b)), "{path:?}");
                proptest::prop_assert!(path.starts_with('/') && !path.starts_with("//"));
                let base = Url::parse("http://portal.example:3000/x/y").expect("base");
                proptest::prop_assert_eq!(base.join(&path).expect("joins").origin(), base.origin());
            }
        }
    }
}
