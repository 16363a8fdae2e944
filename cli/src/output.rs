//! What the commands print: the API's JSON as it came (`--output json`), or tables and
//! lines for people (`--output table`).

use serde_json::Value;

/// Columns padded to their widest cell; the last one is not padded.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count() + 2;
                out.push_str(&" ".repeat(pad));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// A string field, or empty.
pub fn text(value: &Value, field: &str) -> String {
    match &value[field] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// An RFC 3339 time from the API as people read it: `2026-11-26 14:00 UTC`.
pub fn when(value: &Value, field: &str) -> String {
    let raw = text(value, field);
    match chrono::DateTime::parse_from_rfc3339(&raw) {
        Ok(t) => t.with_timezone(&chrono::Utc).format("%Y-%m-%d %H:%M UTC").to_string(),
        Err(_) => raw,
    }
}

/// `key: value` lines, the keys aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
        out.push_str(&format!("{key:width$}  {value}\n"));
    }
    out
}
