//! The platform's wings depend one way (ARCHITECTURE.md): a module may name its own wing,
//! a lower one or the root, never a higher wing. Read from the source, so a new `use` that
//! reaches upward fails here, not in a reviewer's head.
#![allow(clippy::expect_used)] // a test stops with its message

use std::path::{Path, PathBuf};

/// Top to bottom; the root (files directly in `src/`) is below them all.
const WINGS: [&str; 4] = ["identity", "tenancy", "provisioning", "capacity"];

/// `lib.rs` holds the `Platform` handle with each wing's state (the book, sign-in rates,
/// provider clients, upstream caches); `demo.rs` seeds every wing for `make run`, and
/// nothing uses it.
const ABOVE_ALL: [&str; 2] = ["lib.rs", "demo.rs"];

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read the source folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The wing's rank (0 = top); the root ranks below every wing.
fn rank(wing: Option<&str>) -> usize {
    wing.and_then(|w| WINGS.iter().position(|x| *x == w)).unwrap_or(WINGS.len())
}

#[test]
fn no_module_names_a_wing_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut upward = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        if ABOVE_ALL.iter().any(|f| relative == Path::new(f)) {
            continue;
        }
        let own = relative.components().next().and_then(|c| c.as_os_str().to_str()).filter(|c| !c.ends_with(".rs"));
        let text = std::fs::read_to_string(file).expect("read a source file");
        // Tests may set up anything.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for wing in WINGS {
            if rank(Some(wing)) < rank(own) && code.contains(&format!("crate::{wing}")) {
                upward.push(format!("{} names crate::{wing}", relative.display()));
            }
        }
    }
    assert!(files.len() > 30, "the platform's sources were found ({})", files.len());
    assert!(upward.is_empty(), "modules that reach a higher wing:\n{}", upward.join("\n"));
}
