//! Where `berthctl login` keeps the portal's address and the token: `berth/config.json` in
//! the user's config directory (`$XDG_CONFIG_HOME`, else `~/.config`), readable by its
//! owner only (0600), since the token acts as them.

use std::io::Write;
use std::path::PathBuf;

use etcetera::BaseStrategy;
use serde::{Deserialize, Serialize};

use crate::client::Failure;

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Config {
    pub url: String,
    pub token: String,
}

pub fn path() -> Result<PathBuf, Failure> {
    let dirs = etcetera::choose_base_strategy()
        .map_err(|e| Failure::Local(format!("cannot find your config directory: {e}")))?;
    Ok(dirs.config_dir().join("berth").join("config.json"))
}

/// The saved config; `None` before the first `login`.
pub fn load() -> Result<Option<Config>, Failure> {
    let path = path()?;
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
            Failure::Local(format!("{} is not a berthctl config ({e}); run `berthctl login`", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Failure::Local(format!("cannot read {}: {e}", path.display()))),
    }
}

/// Writes the config, owner-only from its first byte (and made so if it existed wider).
pub fn save(config: &Config) -> Result<PathBuf, Failure> {
    let path = path()?;
    let failed = |e: std::io::Error| Failure::Local(format!("cannot write {}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(0o600);
        if path.exists() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(failed)?;
        }
    }
    let mut file = options.open(&path).map_err(failed)?;
    let text = serde_json::to_string_pretty(config).map_err(|e| Failure::Local(e.to_string()))?;
    file.write_all(text.as_bytes()).map_err(failed)?;
    file.write_all(b"\n").map_err(failed)?;
    Ok(path)
}
