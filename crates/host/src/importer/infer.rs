//! What an entry's argv and environment say it needs: the paths it names
//! granted (read-write for the known [`WRITERS`], read-only otherwise), the
//! package or virtualenv of its script measured, and which variables look
//! like secrets.

use std::path::{Path, PathBuf};

use crate::grants::fs::package_root;

/// Whether an environment variable's name says it holds a secret:
/// `*_TOKEN`, `*_KEY`, `*SECRET*`, `*PASSWORD*` (any case).
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.ends_with("_TOKEN")
        || upper.ends_with("_KEY")
        || upper.contains("SECRET")
        || upper.contains("PASSWORD")
}

/// What a script command runs from, to measure and grant: the virtualenv
/// its `#!` interpreter lives in (`VENV/bin/python` beside
/// `VENV/pyvenv.cfg`, as pip and pipx console scripts are), else its
/// package (the nearest directory above it holding `package.json`,
/// `pyproject.toml` or `setup.py`). `None` for a binary, or a script in
/// neither.
pub fn script_package(script: &Path) -> Option<PathBuf> {
    use std::io::Read as _;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(script).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = String::from_utf8_lossy(line.split(|b| *b == b'\n').next()?).into_owned();
    let interpreter = PathBuf::from(line.split_whitespace().next()?);
    let venv = interpreter
        .parent()
        .filter(|bin| bin.file_name() == Some(std::ffi::OsStr::new("bin")))
        .and_then(Path::parent)
        .filter(|root| root.join("pyvenv.cfg").is_file());
    if let Some(venv) = venv {
        return std::fs::canonicalize(venv).ok();
    }
    let package = package_root(script);
    ["package.json", "pyproject.toml", "setup.py"]
        .iter()
        .any(|marker| package.join(marker).is_file())
        .then_some(package)
}

/// Servers whose documented purpose is writing what they are pointed at:
/// their path arguments (and paths in their `env`) are granted read-write,
/// a file by its directory. Everything else gets read-only grants.
pub const WRITERS: &[&str] = &[
    "server-filesystem",
    "mcp-server-git",
    "mcp-server-sqlite",
    "server-memory",
    // A workbook directory (`--allow-dir`), or workbooks anywhere: both
    // PyPI's excel-mcp-server and npm's @negokaz/excel-mcp-server.
    "excel-mcp-server",
    // A vault of notes it creates and edits.
    "obsidian-mcp",
    // A knowledge graph's file (`--memory-path`, MEMORY_FILE_PATH).
    "mcp-knowledge-graph",
    // Papers it downloads and the topics it watches (`--storage-path`).
    "arxiv-mcp-server",
    // Projects' memory files under MEMORY_BANK_ROOT.
    "memory-bank-mcp",
    // A database file (`--db-path`) with its journal beside it.
    "mcp-server-duckdb",
    "mcp-sqlite",
    // MCP Toolbox for Databases: a SQLite file (`--prebuilt sqlite`,
    // SQLITE_DATABASE) it creates tables in, its journal beside it.
    "@toolbox-sdk/server",
];

/// Grants and measured paths inferred from a server's argv.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Inferred {
    /// Paths to grant, and whether read-write.
    pub dirs: Vec<(PathBuf, bool)>,
    /// The package an interpreter runs, to measure.
    pub measure: Vec<PathBuf>,
    /// What was inferred, one line each, for the operator to review.
    pub notes: Vec<String>,
}

/// Whether `command args` is one of the [`WRITERS`].
pub fn is_writer(command: &str, args: &[String]) -> bool {
    std::iter::once(command)
        .chain(args.iter().map(String::as_str))
        .any(|a| WRITERS.iter().any(|w| a.contains(w)))
}

/// `value` as an absolute path (`~/` taken from `HOME`), if it is one.
fn absolute(value: &str, home: Option<&Path>) -> Option<PathBuf> {
    let path = match (value.strip_prefix("~/"), home) {
        (Some(rest), Some(home)) => home.join(rest),
        _ => PathBuf::from(value),
    };
    path.is_absolute().then_some(path)
}

/// Grants `path` (named `how`), as [`infer_grants`] says: for a writer,
/// read-write, and a file (or one it is to create, in a directory that
/// exists) by its directory, where a database keeps its journal and an
/// editor writes its new copy before the rename; otherwise read-only, and
/// only what exists. `false` when nothing was granted.
fn grant_path(
    inferred: &mut Inferred,
    path: &Path,
    writer: bool,
    original: &str,
    how: &str,
) -> bool {
    let real = std::fs::canonicalize(path).ok();
    let dir = match (&real, writer) {
        (Some(real), true) if real.is_file() => real.parent().map(Path::to_owned),
        (None, true) => path
            .parent()
            .and_then(|parent| std::fs::canonicalize(parent).ok())
            .filter(|parent| parent.is_dir()),
        _ => None,
    };
    // A directory no implicit grant may be (the root, a system or
    // top-level directory, the home directory, one holding Moat's own) is
    // not granted for a file in it: the file alone is, when it exists.
    let refused = dir.as_deref().and_then(|dir| {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        crate::native::learn::refusal(dir, true, home.as_deref())
            .map(str::to_owned)
            .or_else(|| crate::grants::Kept::from_env(&[]).refusal(dir))
    });
    if let (Some(dir), Some(why)) = (&dir, &refused) {
        inferred.notes.push(format!(
            "`{original}`: {} ({how}) is a file it writes, but its directory {} is not granted ({why}): grant what it needs with a `dirs` entry",
            path.display(),
            dir.display(),
        ));
    }
    match (dir.filter(|_| refused.is_none()), real) {
        (Some(dir), _) => {
            inferred.notes.push(format!(
                "`{original}`: grants read-write {}, the directory of {} ({how}), for the files it writes beside it",
                dir.display(),
                path.display(),
            ));
            inferred.dirs.push((dir, true));
        }
        (None, Some(real)) => {
            inferred.notes.push(format!(
                "`{original}`: grants {} {} ({how})",
                if writer { "read-write" } else { "read-only" },
                real.display()
            ));
            inferred.dirs.push((real, writer));
        }
        (None, None) => return false,
    }
    true
}

/// Grants the paths in a server's `env` values (`MEMORY_FILE_PATH=/p/g.jsonl`,
/// `DATA_DIR=~/d`) as [`infer_grants`] grants its arguments' paths. `env`
/// holds only what is copied into the config, never a secret's value.
pub fn infer_env_grants(
    inferred: &mut Inferred,
    env: &[(&String, &String)],
    writer: bool,
    original: &str,
) {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    for (name, value) in env {
        let Some(path) = absolute(value, home.as_deref()) else {
            continue;
        };
        let how = format!("named in its env {name}");
        if !grant_path(inferred, &path, writer, original, &how) {
            inferred.notes.push(format!(
                "`{original}`: env {name} names {}, which does not exist: not granted",
                path.display()
            ));
        }
    }
}

/// Infers grants from argv (see the README, "Bringing your existing
/// config"): an interpreter's script file makes its package (the nearest
/// directory holding `package.json`, `pyproject.toml` or `setup.py`, else
/// the script's directory) measured and granted read-only; every other
/// absolute (or `~/`) argument naming an existing file or directory is
/// granted, read-write for the [`WRITERS`], read-only otherwise. A writer's
/// file (its database, its graph), or a file it is to create in a
/// directory that exists, is granted by its directory, read-write.
pub fn infer_grants(command: &str, args: &[String], original: &str) -> Inferred {
    let mut inferred = Inferred::default();
    let base = command.rsplit('/').next().unwrap_or(command);
    let interpreter = ["node", "python", "python3", "deno", "bun"]
        .iter()
        .any(|i| base == *i || (base.starts_with("python3.") && *i == "python3"));
    let writer = is_writer(command, args);
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut entry_seen = false;
    for arg in args {
        let value = arg.split_once('=').map_or(arg.as_str(), |(flag, value)| {
            if flag.starts_with('-') {
                value
            } else {
                arg.as_str()
            }
        });
        let Some(path) = absolute(value, home.as_deref()) else {
            if interpreter && !arg.starts_with('-') {
                entry_seen = true;
            }
            continue;
        };
        let real = std::fs::canonicalize(&path).ok();
        if let Some(real) = real
            .as_ref()
            .filter(|r| interpreter && !entry_seen && r.is_file())
        {
            entry_seen = true;
            let package = package_root(real);
            inferred.notes.push(format!(
                "`{original}`: measures and grants read-only {}, the package of its script",
                package.display()
            ));
            inferred.measure.push(package.clone());
            inferred.dirs.push((package, false));
            continue;
        }
        // What does not exist is granted only as a writer's file to be.
        if real.is_none() && !writer {
            continue;
        }
        if interpreter && !arg.starts_with('-') {
            entry_seen = true;
        }
        grant_path(
            &mut inferred,
            &path,
            writer,
            original,
            "named in its arguments",
        );
    }
    inferred
}
