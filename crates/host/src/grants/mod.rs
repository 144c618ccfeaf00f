//! Grants: what a server is given of the host, one module per capability,
//! each with its meaning in one place (as wasmtime-wasi has a module per
//! interface and Spin a factor per capability). The launchers keep the
//! system calls (a preopen, a Landlock rule, a bind mount); what a grant
//! means, how it is checked and how it is written back as TOML is here.
//!
//! - [`fs`]: `dirs` entries: `ro`/`rw`, opened once without following a
//!   link, the inode pinned by the lock.
//! - [`env`]: `env` and `env_passthrough`: the exact environment, read
//!   when a launch is planned, over a launcher's base and under Moat's own
//!   variables.
//! - [`net`]: `net` entries: TCP `host:port`, and `http(s)://` origins for
//!   wasi:http.
//! - [`protect`]: what no grant may overlap (Moat's own files, what another
//!   server runs).
//! - [`toml`]: a grant written as `moat.toml` lines, for every command that
//!   proposes one (import, learn, the sandbox's hints, Wassette policies).

pub(crate) mod env;
pub(crate) mod fs;
pub(crate) mod net;
pub(crate) mod protect;
pub mod toml;

use std::path::PathBuf;

pub use env::EnvGrant;
pub use fs::{DirGrant, DirMode, Writer};
#[cfg(unix)]
pub use fs::{OpenedGrant, open, open_all};
pub use net::{HttpGrant, NetGrant, net_line};
pub use protect::{
    AUDIT_KEY, CACHE, CLAIM_KEY, CLAIMS, CONFIG_DIR, DATA_DIR, Kept, Protected, Runs, STATE_DIR,
    check_protected, check_runs,
};

/// Errors opening or checking a grant, naming the server and the path.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error(
        "server `{server}`: grant {path}: {link} is a symbolic link (to {target}); grants are opened without following links: grant the real path {real}"
    )]
    Link {
        server: String,
        path: PathBuf,
        link: PathBuf,
        target: PathBuf,
        real: PathBuf,
    },
    #[error("server `{server}`: grant {path}: {syscall}: {source}")]
    Open {
        server: String,
        path: PathBuf,
        syscall: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "server `{server}`: grant {path} overlaps Moat's {what} at {protected}: a server may not reach it; grant a directory that neither holds it nor lies inside it"
    )]
    Protected {
        server: String,
        path: PathBuf,
        what: &'static str,
        protected: PathBuf,
    },
    #[error(
        "server `{writer}`: rw grant {grant} overlaps the {what} {path} of server `{server}`: a server Moat launches may not write what a server runs after it is measured; grant it `ro`, or a directory that neither holds {path} nor lies inside it"
    )]
    OverRun {
        /// The server with the `rw` grant.
        writer: String,
        grant: PathBuf,
        /// The server whose file it overlaps (maybe `writer` itself).
        server: String,
        /// "executable", "#! interpreter" or "measure path".
        what: &'static str,
        path: PathBuf,
    },
    #[error(
        "server `{server}`: grant {path} is not what was locked (inode {locked} in the lock, {now} now): it was replaced since `moat lock`; check what it holds, then run `moat lock` to approve it"
    )]
    Changed {
        server: String,
        path: PathBuf,
        locked: u64,
        now: u64,
    },
}
