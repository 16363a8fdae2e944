//! Cursor pagination, the same for every listing that grows without bound (environments,
//! the audit log, notifications): `?limit=` (how many, up to the listing's most) and
//! `?cursor=` (the previous page's `next_cursor`, opaque). A listing answers `next_cursor`,
//! `null` on its last page. A cursor is the last item's place in the listing's order, so a
//! page never repeats or skips an item as new ones arrive.

use base64::Engine as _;
use base64::prelude::BASE64_URL_SAFE_NO_PAD;
use berth_domain::Refusal;
use berth_platform::Error;
use serde::Deserialize;
use utoipa::IntoParams;

/// Which page of a listing.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// How many at most (from 1; the listing says its default and most); empty for the
    /// default.
    #[serde(default)]
    #[param(pattern = "^[0-9]*$")]
    limit: String,
    /// The previous page's `next_cursor`; empty for the first page.
    #[serde(default)]
    cursor: String,
}

impl PageQuery {
    /// The page size asked for, `default` when none, refused past `most`.
    pub fn limit(&self, default: i64, most: i64) -> Result<i64, Error> {
        match self.limit.trim() {
            "" => Ok(default),
            text => text.parse::<i64>().ok().filter(|n| (1..=most).contains(n)).ok_or_else(|| {
                Refusal::InvalidPage(format!("limit must be a whole number from 1 to {most}, not \"{text}\"")).into()
            }),
        }
    }

    /// The place a cursor of `listing` holds, `None` for the first page. A cursor this
    /// listing did not give is refused.
    pub fn place(&self, listing: &str) -> Result<Option<String>, Error> {
        let cursor = self.cursor.trim();
        if cursor.is_empty() {
            return Ok(None);
        }
        let decoded = BASE64_URL_SAFE_NO_PAD.decode(cursor).ok().and_then(|bytes| String::from_utf8(bytes).ok());
        let place = decoded.as_deref().and_then(|text| text.strip_prefix(listing)).and_then(|t| t.strip_prefix(':'));
        match place {
            Some(place) if !place.is_empty() => Ok(Some(place.to_owned())),
            _ => Err(Refusal::InvalidPage(
                "cursor is not one this listing gave (use next_cursor as it came, or none for the first page)".into(),
            )
            .into()),
        }
    }

    /// The place as a number (an id), refused like a cursor that is not this listing's.
    pub fn id_place(&self, listing: &str) -> Result<Option<i64>, Error> {
        match self.place(listing)? {
            None => Ok(None),
            Some(place) => place.parse().map(Some).map_err(|_| self.foreign()),
        }
    }

    /// Why a cursor that decoded is still not this listing's.
    pub fn foreign(&self) -> Error {
        Refusal::InvalidPage("cursor is not one this listing gave (use next_cursor as it came)".into()).into()
    }
}

/// The cursor after an item at `place` in `listing`.
pub fn cursor(listing: &str, place: &str) -> String {
    BASE64_URL_SAFE_NO_PAD.encode(format!("{listing}:{place}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(limit: &str, cursor: &str) -> PageQuery {
        PageQuery { limit: limit.into(), cursor: cursor.into() }
    }

    #[test]
    fn a_cursor_holds_its_place_and_only_in_its_listing() {
        let next = cursor("environments", "1764000000000.env-7");
        assert_eq!(page("", &next).place("environments").expect("read"), Some("1764000000000.env-7".into()));
        assert!(page("", &next).place("audit").is_err(), "another listing's cursor");
        assert!(page("", "not a cursor").place("environments").is_err());
        assert!(page("", &cursor("audit", "x")).id_place("audit").is_err(), "an audit cursor is an id");
        assert_eq!(page("", &cursor("audit", "42")).id_place("audit").expect("read"), Some(42));
        assert_eq!(page("", " ").place("audit").expect("first page"), None);
    }

    #[test]
    fn a_limit_is_a_whole_number_within_the_listings_most() {
        assert_eq!(page("", "").limit(100, 500).expect("default"), 100);
        assert_eq!(page("500", "").limit(100, 500).expect("most"), 500);
        for bad in ["0", "501", "-1", "ten", "1.5"] {
            let refused = page(bad, "").limit(100, 500).expect_err(bad).to_string();
            assert!(refused.contains("limit must be a whole number from 1 to 500"), "{refused}");
        }
    }
}
