//! The base environment a native server starts with: a small base that
//! ordinary runtimes need (a system `PATH` with the executable's and
//! interpreter's directories in front, a private writable `HOME`, `TMPDIR`,
//! a UTF-8 locale). The config's `env` grant goes over it and Moat's own
//! variables (the egress proxy's) over everything, as
//! [`crate::grants::env`] says. Nothing else of Moat's environment reaches
//! a server.
//!
//! The base holds no secret and no path of the user's: `PATH` names only
//! system directories and the directories of what the server runs (which
//! it may read anyway), and `HOME` and `TMPDIR` lie in the server's private
//! `/tmp` (or a `moat learn` run's scratch directory), which no other
//! process sees and which goes when the server stops.

use std::path::Path;

/// The system directories of the base `PATH`, searched after the
/// directory of the interpreter (of a `#!` script) or of the executable.
pub const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The locale every server gets unless its config says otherwise: UTF-8,
/// present on every glibc and musl system without a locale package.
pub const LANG: &str = "C.UTF-8";

pub use crate::sandbox::root::PRIVATE_HOME;

/// Where the server may write for itself, which decides `HOME` and
/// `TMPDIR`.
#[derive(Clone, Copy, Debug)]
pub enum Scratch<'a> {
    /// A root of the server's own: `HOME` is [`PRIVATE_HOME`], `TMPDIR` is
    /// `/tmp`.
    OwnRoot,
    /// A private `/tmp` in the host's tree (a `moat learn` run): both are
    /// `/tmp`.
    PrivateTmp,
    /// A scratch directory of the run's own (a `moat learn` run without a
    /// private `/tmp`): both are that directory.
    Dir(&'a Path),
    /// Nowhere private: neither is set (the server's writes go where its
    /// grants say).
    None,
}

/// The base environment of a server that runs `executable` (through
/// `interpreter`, for a `#!` script), in the order given.
pub fn base(
    executable: &Path,
    interpreter: Option<&Path>,
    scratch: Scratch<'_>,
) -> Vec<(String, String)> {
    let mut path: Vec<String> = Vec::new();
    // A script's interpreter's directory (where `node` finds `npm`, say);
    // a binary's own (where `uvx` finds `uv`).
    if let Some(dir) = interpreter
        .unwrap_or(executable)
        .parent()
        .and_then(Path::to_str)
        && !dir.is_empty()
        && !dir.contains(':')
        && !SYSTEM_PATH.split(':').any(|p| p == dir)
    {
        path.push(dir.to_owned());
    }
    path.push(SYSTEM_PATH.to_owned());
    let mut vars = vec![
        ("PATH".to_owned(), path.join(":")),
        ("LANG".to_owned(), LANG.to_owned()),
    ];
    let (home, tmp) = match scratch {
        Scratch::OwnRoot => (Some(PRIVATE_HOME.to_owned()), Some("/tmp".to_owned())),
        Scratch::PrivateTmp => (Some("/tmp".to_owned()), Some("/tmp".to_owned())),
        Scratch::Dir(dir) => {
            let dir = dir.display().to_string();
            (Some(dir.clone()), Some(dir))
        }
        Scratch::None => (None, None),
    };
    if let Some(home) = home {
        vars.push(("HOME".to_owned(), home));
    }
    if let Some(tmp) = tmp {
        vars.push(("TMPDIR".to_owned(), tmp));
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_puts_the_interpreters_directory_before_the_system() {
        let vars = base(
            Path::new("/opt/node/lib/node_modules/x/cli.js"),
            Some(Path::new("/opt/node/bin/node")),
            Scratch::OwnRoot,
        );
        assert_eq!(
            vars,
            [
                ("PATH".to_owned(), format!("/opt/node/bin:{SYSTEM_PATH}")),
                ("LANG".to_owned(), "C.UTF-8".to_owned()),
                ("HOME".to_owned(), "/tmp/home".to_owned()),
                ("TMPDIR".to_owned(), "/tmp".to_owned()),
            ]
        );
        // A binary's own directory; a system directory is not named twice;
        // nowhere private, no HOME.
        let vars = base(Path::new("/home/u/.local/bin/uvx"), None, Scratch::None);
        assert_eq!(vars[0].1, format!("/home/u/.local/bin:{SYSTEM_PATH}"));
        let vars = base(Path::new("/usr/bin/python3"), None, Scratch::None);
        assert_eq!(vars[0], ("PATH".to_owned(), SYSTEM_PATH.to_owned()));
        assert!(
            !vars
                .iter()
                .any(|(name, _)| name == "HOME" || name == "TMPDIR")
        );
    }
}
