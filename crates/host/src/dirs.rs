//! Where Moat keeps its own files by default, one rule for each kind: an
//! explicit `MOAT_*` variable, else the XDG base directory, else the
//! conventional place under `$HOME`. An empty variable counts as unset.
//! Nothing here creates a directory; callers open what they need.

use std::ffi::OsString;
use std::path::PathBuf;

fn set(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|value| !value.is_empty())
}

/// `$OWN`, else `$XDG/moat`, else `$HOME/HOME_PATH`.
fn resolve(own: &str, xdg: &str, home_path: &str) -> Option<PathBuf> {
    set(own)
        .map(PathBuf::from)
        .or_else(|| set(xdg).map(|dir| PathBuf::from(dir).join("moat")))
        .or_else(|| set("HOME").map(|home| PathBuf::from(home).join(home_path)))
}

/// The compiled-component cache: `$MOAT_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/moat`, else `$HOME/.cache/moat`.
pub fn cache() -> Option<PathBuf> {
    resolve("MOAT_CACHE_DIR", "XDG_CACHE_HOME", ".cache/moat")
}

/// Moat's state (the audit key): `$MOAT_STATE_DIR`, else
/// `$XDG_STATE_HOME/moat`, else `$HOME/.local/state/moat`.
pub fn state() -> Option<PathBuf> {
    resolve("MOAT_STATE_DIR", "XDG_STATE_HOME", ".local/state/moat")
}

/// Moat's data (the store): `$MOAT_DATA_DIR`, else `$XDG_DATA_HOME/moat`,
/// else `$HOME/.local/share/moat`.
pub fn data() -> Option<PathBuf> {
    resolve("MOAT_DATA_DIR", "XDG_DATA_HOME", ".local/share/moat")
}

/// The store of installed packages and pulled components:
/// `$MOAT_DATA_DIR/store`, else `$XDG_DATA_HOME/moat/store`, else
/// `$HOME/.local/share/moat/store`.
pub fn store() -> Option<PathBuf> {
    data().map(|data| data.join("store"))
}

/// Moat's configuration directory, should a user keep configs there:
/// `$XDG_CONFIG_HOME/moat`, else `$HOME/.config/moat` (Moat itself reads
/// `moat.toml` from where it is told). Only kept clear of implicit grants.
pub fn config() -> Option<PathBuf> {
    set("XDG_CONFIG_HOME")
        .map(|dir| PathBuf::from(dir).join("moat"))
        .or_else(|| set("HOME").map(|home| PathBuf::from(home).join(".config/moat")))
}
