//! Import: turns a Claude Desktop `claude_desktop_config.json`
//! (`mcpServers`) or a VS Code `.vscode/mcp.json` (`servers`) into
//! `moat.toml` entries, measuring each command's digest at import, and says
//! what it could not carry over; and `moat add`'s one server, from its
//! command line, written to moat.toml ([`add_to_config`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::command::resolve;
use crate::grants::DirMode;
use crate::grants::fs::package_root;
use crate::grants::toml::string as toml_string;
use crate::identity::Digest;

mod add;
pub use add::{AddError, Added, add_to_config};

/// Errors reading a client config.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a client config: {detail}")]
    Format { path: String, detail: String },
}

#[derive(Deserialize)]
struct ClientConfig {
    #[serde(rename = "mcpServers")]
    mcp_servers: Option<BTreeMap<String, Entry>>,
    servers: Option<BTreeMap<String, Entry>>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(rename = "type")]
    kind: Option<String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    url: Option<String>,
    cwd: Option<String>,
    #[serde(rename = "envFile")]
    env_file: Option<String>,
}

/// The result of an import: TOML text and what was not carried over.
#[derive(Debug, Default)]
pub struct Imported {
    /// `[servers.NAME]` entries, ready to append to a moat.toml.
    pub toml: String,
    /// One line per server or setting that was not carried over.
    pub skipped: Vec<String>,
}

/// A valid Moat server name for `name`: invalid characters become `-`, `__`
/// collapses, at most 32 characters.
pub fn server_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    while out.contains("__") {
        out = out.replace("__", "_");
    }
    out.truncate(32);
    if out.is_empty() {
        "server".to_owned()
    } else {
        out
    }
}

/// Imports the client config at `path`. Commands are resolved on `path_var`
/// and hashed; a command that cannot be found is imported unpinned, and
/// said. Package launchers (`npx -y PKG`, `uvx PKG`, ...) are installed into
/// `store` (see [`crate::packages`]) and imported as the installed program;
/// with no store they are imported as configured, and said.
pub fn import(
    path: &Path,
    path_var: Option<&std::ffi::OsStr>,
    store: Option<&Path>,
) -> Result<Imported, ImportError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ImportError::Read {
        path: shown.clone(),
        source,
    })?;
    let config: ClientConfig = serde_json::from_str(&text).map_err(|e| ImportError::Format {
        path: shown.clone(),
        detail: e.to_string(),
    })?;
    let entries = match (config.mcp_servers, config.servers) {
        (Some(servers), _) | (None, Some(servers)) => servers,
        (None, None) => {
            return Err(ImportError::Format {
                path: shown,
                detail: "neither `mcpServers` (Claude Desktop) nor `servers` (VS Code) is present"
                    .into(),
            });
        }
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let mut imported = Imported::default();
    let mut used = std::collections::BTreeSet::new();
    for (original, entry) in entries {
        let mut name = server_name(&original);
        while !used.insert(name.clone()) {
            name = server_name(&format!("{name}-2"));
        }
        if entry.command.is_none() {
            let what = match (&entry.url, entry.kind.as_deref()) {
                (Some(url), _) => format!("a remote server at {url}"),
                (None, Some(kind)) => format!("a server of type {kind:?} without a command"),
                (None, None) => "an entry without a command".to_owned(),
            };
            imported.skipped.push(format!(
                "`{original}`: {what}: not carried over (remote servers are not supported yet)"
            ));
            continue;
        }
        if original != name {
            imported
                .skipped
                .push(format!("`{original}`: renamed to `{name}`"));
        }
        import_entry(
            &mut imported,
            &name,
            &original,
            &entry,
            base,
            path_var,
            store,
        );
    }
    Ok(imported)
}

/// One server for `moat add`: `command args` as a client config would list
/// it, imported like [`import`] does, under `name` (default: derived from
/// the package or the command).
pub fn add(
    name: Option<&str>,
    command: &str,
    args: &[String],
    base: &Path,
    path_var: Option<&std::ffi::OsStr>,
    store: Option<&Path>,
) -> (String, Imported) {
    let derived = match crate::packages::recognise(command, args) {
        Some(Ok(request)) => {
            let last = request.name.rsplit('/').next().unwrap_or(&request.name);
            let last = last.split('.').next().unwrap_or(last);
            ["mcp-server-", "server-", "mcp-"]
                .iter()
                .find_map(|prefix| last.strip_prefix(prefix))
                .unwrap_or(last)
                .to_owned()
        }
        _ => command.rsplit('/').next().unwrap_or(command).to_owned(),
    };
    let name = server_name(name.unwrap_or(&derived));
    let entry = Entry {
        kind: None,
        command: Some(command.to_owned()),
        args: args.to_vec(),
        env: BTreeMap::new(),
        url: None,
        cwd: None,
        env_file: None,
    };
    let mut imported = Imported::default();
    import_entry(&mut imported, &name, &name, &entry, base, path_var, store);
    (name, imported)
}

/// The package a launcher entry names, installed into `store`; `None` (and
/// a note) when it is not a launcher or could not be installed.
fn install_package(
    imported: &mut Imported,
    original: &str,
    command: &str,
    args: &[String],
    path_var: Option<&std::ffi::OsStr>,
    store: Option<&Path>,
) -> Option<(crate::packages::Request, crate::packages::Installed)> {
    let request = match crate::packages::recognise(command, args)? {
        Ok(request) => request,
        Err(error) => {
            imported.skipped.push(format!(
                "`{original}`: {error}; imported as configured, which fetches and runs other code at launch"
            ));
            return None;
        }
    };
    let Some(store) = store else {
        imported.skipped.push(format!(
            "`{original}`: `{}` fetches {} at launch and was not installed (no package store); pin the interpreter and add its script to `measure`",
            request.launcher, request.name
        ));
        return None;
    };
    if let crate::packages::Entry::Module(module) = &request.entry {
        imported.skipped.push(format!(
            "`{original}`: {} {module}: no {top}.py or {top}/ is importable from its working directory or PYTHONPATH, so it is a package: installing {} from PyPI",
            request.launcher,
            request.name,
            top = module.split('.').next().unwrap_or(module),
        ));
    }
    match crate::packages::install(store, &request, None, path_var, true) {
        Ok(installed) => Some((request, installed)),
        Err(error) => {
            imported.skipped.push(format!(
                "`{original}`: {error}; imported as configured, which fetches and runs other code at launch"
            ));
            None
        }
    }
}

/// Writes one `[servers.NAME]` entry for `entry` into `imported`.
fn import_entry(
    imported: &mut Imported,
    name: &str,
    original: &str,
    entry: &Entry,
    base: &Path,
    path_var: Option<&std::ffi::OsStr>,
    store: Option<&Path>,
) {
    let command = entry.command.clone().unwrap_or_default();
    let _ = writeln!(imported.toml, "[servers.{name}]");
    // `python -m MOD` runs a local MOD when one is importable where it
    // runs: that is no package, and installing one of the same name from
    // the index would run someone else's code with this entry's secrets.
    let local = match crate::packages::recognise(&command, &entry.args) {
        Some(Ok(crate::packages::Request {
            entry: crate::packages::Entry::Module(module),
            ..
        })) => local_module(
            &module,
            &workdirs(entry.cwd.as_deref(), base),
            entry.env.get("PYTHONPATH").map(String::as_str),
        )
        .map(|found| (module, found)),
        _ => None,
    };
    let package = if local.is_some() {
        None
    } else {
        install_package(imported, original, &command, &entry.args, path_var, store)
    };
    let (args, mut inferred) = match &package {
        Some((request, installed)) => {
            let record = &installed.record;
            let interpreter = installed.interpreter.display().to_string();
            let _ = writeln!(imported.toml, "command = {}", toml_string(&interpreter));
            match std::fs::read(&installed.interpreter) {
                Ok(bytes) => {
                    let _ = writeln!(imported.toml, "sha256 = \"{}\"", Digest::of(&bytes));
                }
                Err(error) => {
                    let _ = writeln!(imported.toml, "allow_unmeasured = true");
                    imported.skipped.push(format!(
                        "`{original}`: could not read {interpreter} to pin it ({error}); imported unpinned"
                    ));
                }
            }
            imported.skipped.push(format!(
                "`{original}`: installed {}{} {}{} ({} `{}`) into {}{}; it runs from there, measured and read-only, and fetches nothing at launch",
                record.name,
                if record.extras.is_empty() { String::new() } else { format!("[{}]", record.extras.join(",")) },
                record.version,
                if record.with.is_empty() { String::new() } else { format!(" with {}", record.with.join(", ")) },
                record.ecosystem,
                record.entry,
                record.store.display(),
                if installed.reused { " (already in the store)" } else { "" }
            ));
            let mut inferred = infer_grants(&record.name, &request.args, original);
            inferred.measure.insert(0, record.store.clone());
            inferred.dirs.insert(0, (record.store.clone(), false));
            let args: Vec<String> = record
                .entry_args
                .iter()
                .chain(&request.args)
                .cloned()
                .collect();
            (args, inferred)
        }
        None => {
            // A bare name is written as the file it resolved to on Moat's
            // PATH at import: the digest pinned is that file's, and an
            // agent started with another PATH must not run another file
            // under the same name (and be refused as a digest mismatch).
            let written = match resolve(&command, base, path_var) {
                Ok(resolved) if !command.contains('/') => {
                    let found = resolved.found.display().to_string();
                    imported.skipped.push(format!(
                        "`{original}`: `{command}` is {found} on Moat's PATH at import; the config names that file, so another PATH cannot change what runs"
                    ));
                    found
                }
                _ => command.clone(),
            };
            let _ = writeln!(imported.toml, "command = {}", toml_string(&written));
            pin_command(imported, original, &written, base, path_var);
            let mut inferred = infer_grants(&command, &entry.args, original);
            if let Some((module, found)) = &local {
                keep_local(&mut inferred, original, &command, module, found);
            }
            let script = resolve(&command, base, path_var)
                .ok()
                .and_then(|resolved| script_package(&resolved.target));
            if let Some(package) = script {
                inferred.notes.push(format!(
                    "`{original}`: measures and grants read-only {}, the environment of its script",
                    package.display()
                ));
                inferred.measure.insert(0, package.clone());
                inferred.dirs.insert(0, (package, false));
            }
            (entry.args.clone(), inferred)
        }
    };
    if !args.is_empty() {
        let args: Vec<String> = args.iter().map(|a| toml_string(a)).collect();
        let _ = writeln!(imported.toml, "args = [{}]", args.join(", "));
    }
    match (&local, &entry.cwd) {
        (Some((_, found)), _) => {
            let cwd = found.workdir.display().to_string();
            let _ = writeln!(imported.toml, "cwd = {}", toml_string(&cwd));
        }
        (None, Some(cwd)) => {
            let _ = writeln!(imported.toml, "cwd = {}", toml_string(cwd));
        }
        (None, None) => {}
    }
    let (secret, plain): (Vec<_>, Vec<_>) =
        entry.env.iter().partition(|(name, _)| looks_secret(name));
    let writer = match &package {
        Some((_, installed)) => is_writer(&installed.record.name, &entry.args),
        None => is_writer(&command, &entry.args),
    };
    infer_env_grants(&mut inferred, &plain, writer, original);
    if !plain.is_empty() {
        let pairs: Vec<String> = plain
            .iter()
            .map(|(k, v)| format!("{} = {}", toml_string(k), toml_string(v)))
            .collect();
        let _ = writeln!(imported.toml, "env = {{ {} }}", pairs.join(", "));
    }
    if !secret.is_empty() {
        let names: Vec<String> = secret.iter().map(|(k, _)| toml_string(k)).collect();
        let _ = writeln!(imported.toml, "env_passthrough = [{}]", names.join(", "));
        for (name, _) in &secret {
            imported.skipped.push(format!(
                "`{original}`: env {name} looks like a secret: its value was not copied; it is passed through from Moat's environment, so set it there"
            ));
        }
    }
    if !inferred.measure.is_empty() {
        let paths: Vec<String> = inferred
            .measure
            .iter()
            .map(|p| toml_string(&p.display().to_string()))
            .collect();
        let _ = writeln!(imported.toml, "measure = [{}]", paths.join(", "));
    }
    if let Some((_, installed)) = &package {
        let record = &installed.record;
        let entry_args: Vec<String> = record.entry_args.iter().map(|a| toml_string(a)).collect();
        let list = |key: &str, items: &[String]| -> String {
            if items.is_empty() {
                return String::new();
            }
            let items: Vec<String> = items.iter().map(|a| toml_string(a)).collect();
            format!("{key} = [{}]\n", items.join(", "))
        };
        let _ = writeln!(
            imported.toml,
            "[servers.{name}.package]\necosystem = \"{}\"\nname = {}\nversion = {}\n{}{}entry = {}\nentry_args = [{}]\nstore = {}\nlockfile_sha256 = \"{}\"",
            record.ecosystem,
            toml_string(&record.name),
            toml_string(&record.version),
            list("extras", &record.extras),
            list("with", &record.with),
            toml_string(&record.entry),
            entry_args.join(", "),
            toml_string(&record.store.display().to_string()),
            record.lockfile_sha256,
        );
    }
    for (path, write) in &inferred.dirs {
        let _ = writeln!(
            imported.toml,
            "{}",
            crate::grants::toml::dir_entry(name, path, None, DirMode::of(*write))
        );
    }
    imported.skipped.append(&mut inferred.notes);
    if let Some(env_file) = &entry.env_file {
        imported
            .skipped
            .push(format!("`{original}`: envFile {env_file:?} not carried over (list the variables in env or env_passthrough)"));
    }
    imported.toml.push('\n');
}

/// Pins `command` as configured: its digest, or `allow_unmeasured` when it
/// cannot be read, said in `imported`.
fn pin_command(
    imported: &mut Imported,
    original: &str,
    command: &str,
    base: &Path,
    path_var: Option<&std::ffi::OsStr>,
) {
    match resolve(command, base, path_var) {
        Ok(resolved) => match std::fs::read(&resolved.target) {
            Ok(bytes) => {
                let _ = writeln!(
                    imported.toml,
                    "sha256 = \"{}\"  # {} at import",
                    Digest::of(&bytes),
                    crate::text::printable(&resolved.target.display().to_string())
                );
            }
            Err(error) => {
                let _ = writeln!(imported.toml, "allow_unmeasured = true");
                imported.skipped.push(format!(
                    "`{original}`: could not read {} to pin it ({error}); imported unpinned",
                    resolved.target.display()
                ));
            }
        },
        Err(error) => {
            let _ = writeln!(imported.toml, "allow_unmeasured = true");
            imported
                .skipped
                .push(format!("`{original}`: {error}; imported unpinned"));
        }
    }
}

/// Where `python -m MODULE` found MODULE without anything installed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalModule {
    /// The working directory it runs in (where it was found, for `cwd`).
    pub workdir: PathBuf,
    /// The directory of its module path that holds it.
    pub dir: PathBuf,
    /// The module's file or directory in `dir`.
    pub found: PathBuf,
    /// How `dir` is on the module path: `cwd` or `PYTHONPATH`.
    pub via: &'static str,
}

/// The working directories a client would run an entry in: its `cwd`
/// (relative to the client config's directory `base`) when it names one;
/// otherwise this process's, the client config's, and for a VS Code
/// `.vscode/mcp.json` the workspace above it.
fn workdirs(cwd: Option<&str>, base: &Path) -> Vec<PathBuf> {
    let base = std::fs::canonicalize(base).unwrap_or_else(|_| base.to_owned());
    if let Some(cwd) = cwd {
        let dir = base.join(cwd);
        return vec![std::fs::canonicalize(&dir).unwrap_or(dir)];
    }
    let mut dirs: Vec<PathBuf> = std::env::current_dir().into_iter().collect();
    dirs.push(base.clone());
    if base.file_name() == Some(std::ffi::OsStr::new(".vscode"))
        && let Some(workspace) = base.parent()
    {
        dirs.push(workspace.to_owned());
    }
    dirs.dedup();
    dirs
}

/// The top-level module `top` in `dir`, as Python's path finder would
/// find it: a `top/` directory (a package, with or without `__init__.py`,
/// or one run by its `__main__.py`), `top.py`, or an extension module.
fn module_in(dir: &Path, top: &str) -> Option<PathBuf> {
    let package = dir.join(top);
    if package.is_dir() {
        return Some(package);
    }
    let source = dir.join(format!("{top}.py"));
    if source.is_file() {
        return Some(source);
    }
    std::fs::read_dir(dir).ok()?.flatten().find_map(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        let extension = name
            .strip_prefix(top)
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|rest| rest.ends_with(".so") || rest == "so" || rest == "pyc");
        (extension && entry.path().is_file()).then(|| entry.path())
    })
}

/// Where `python -m module` finds `module` (its top-level name) without
/// installing anything, when run in one of `workdirs` with `pythonpath`
/// (the entry's `PYTHONPATH`, relative entries taken from the working
/// directory): the working directory first, as `-m` puts it first on the
/// module path, then `PYTHONPATH`. `None` when it is nowhere local.
pub fn local_module(
    module: &str,
    workdirs: &[PathBuf],
    pythonpath: Option<&str>,
) -> Option<LocalModule> {
    let top = module.split('.').next().unwrap_or(module);
    for workdir in workdirs {
        let path = std::iter::once((workdir.clone(), "cwd")).chain(
            pythonpath
                .unwrap_or_default()
                .split(':')
                .filter(|p| !p.is_empty())
                .map(|p| (workdir.join(p), "PYTHONPATH")),
        );
        for (dir, via) in path {
            if let Some(found) = module_in(&dir, top) {
                let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
                return Some(LocalModule {
                    workdir: workdir.clone(),
                    dir,
                    found,
                    via,
                });
            }
        }
    }
    None
}

/// Grants and measures the directory a local `python -m` module was found
/// in, read-only, and says so; a directory no implicit grant may be (the
/// home directory, one holding Moat's own) is left to the operator.
fn keep_local(
    inferred: &mut Inferred,
    original: &str,
    command: &str,
    module: &str,
    found: &LocalModule,
) {
    let python = command.rsplit('/').next().unwrap_or(command);
    #[cfg(unix)]
    let refusal = crate::grants::Kept::from_env(&[]).refusal(&found.dir);
    #[cfg(not(unix))]
    let refusal: Option<String> = None;
    let granted = match refusal {
        None => {
            inferred.measure.insert(0, found.dir.clone());
            inferred.dirs.insert(0, (found.dir.clone(), false));
            format!("{} is measured and granted read-only", found.dir.display())
        }
        Some(why) => format!(
            "{} is neither measured nor granted ({why}): grant what it needs with a `dirs` entry",
            found.dir.display()
        ),
    };
    inferred.notes.push(format!(
        "`{original}`: {python} -m {module}: kept local: {} is importable from {} {}; not installed from PyPI; runs in {}, and {granted}",
        found.found.display(),
        found.via,
        found.dir.display(),
        found.workdir.display(),
    ));
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_desktop_config_becomes_moat_entries() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("claude_desktop_config.json");
        std::fs::write(
            &file,
            r#"{"mcpServers": {
                "files": {"command": "sh", "args": ["-c", "echo $(x)"], "env": {"TOKEN": "t"}},
                "my server!": {"command": "/nonexistent/bin/srv"},
                "remote": {"url": "https://example.invalid/mcp"}
            }}"#,
        )
        .unwrap();
        let path_var = std::env::var_os("PATH");
        let imported = import(&file, path_var.as_deref(), None).unwrap();
        let parsed = crate::config::Config::parse(&dir.path().join("moat.toml"), &imported.toml)
            .expect("the imported entries are a valid moat.toml");
        let files = parsed.server("files").unwrap();
        assert_eq!(files.args, ["-c", "echo $(x)"]);
        assert!(files.sha256.is_some(), "{}", imported.toml);
        let renamed = parsed.server("my-server-").unwrap();
        assert!(renamed.allow_unmeasured);
        assert!(parsed.server("remote").is_err());
        let skipped = imported.skipped.join("\n");
        assert!(
            skipped.contains("`remote`: a remote server at https://example.invalid/mcp"),
            "{skipped}"
        );
        assert!(
            skipped.contains("`my server!`: renamed to `my-server-`"),
            "{skipped}"
        );
        assert!(
            skipped.contains("not found") || skipped.contains("does not exist"),
            "{skipped}"
        );
    }

    #[test]
    fn grants_are_inferred_and_secrets_pass_through() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("project");
        std::fs::create_dir(&project).unwrap();
        let package = dir.path().join("node_modules/server-x");
        std::fs::create_dir_all(package.join("dist")).unwrap();
        std::fs::write(package.join("package.json"), "{}").unwrap();
        std::fs::write(package.join("dist/index.js"), "").unwrap();
        let file = dir.path().join("claude.json");
        let config = serde_json::json!({"mcpServers": {
            "filesystem": {"command": "node", "args": [
                dir.path().join("node_modules/server-filesystem/dist/index.js"),
                project
            ]},
            "x": {"command": "node", "args": [package.join("dist/index.js"), "--root", project],
                  "env": {"GITHUB_TOKEN": "ghp_secret", "API_KEY": "k", "LOG_LEVEL": "debug"}}
        }});
        std::fs::create_dir_all(dir.path().join("node_modules/server-filesystem/dist")).unwrap();
        std::fs::write(
            dir.path()
                .join("node_modules/server-filesystem/package.json"),
            "{}",
        )
        .unwrap();
        std::fs::write(
            dir.path()
                .join("node_modules/server-filesystem/dist/index.js"),
            "",
        )
        .unwrap();
        std::fs::write(&file, config.to_string()).unwrap();
        let imported = import(&file, std::env::var_os("PATH").as_deref(), None).unwrap();
        assert!(!imported.toml.contains("ghp_secret"), "{}", imported.toml);
        let parsed = crate::config::Config::parse(&dir.path().join("moat.toml"), &imported.toml)
            .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
        let real = |p: &Path| std::fs::canonicalize(p).unwrap();
        let grants = |name: &str| -> Vec<(PathBuf, crate::grants::DirMode)> {
            parsed
                .server(name)
                .unwrap()
                .dirs
                .iter()
                .map(|d| (d.host.clone(), d.mode))
                .collect()
        };
        use crate::grants::DirMode::{Ro, Rw};
        assert_eq!(
            grants("filesystem"),
            [
                (real(&dir.path().join("node_modules/server-filesystem")), Ro),
                (real(&project), Rw)
            ],
            "the filesystem server's purpose is writing its directories"
        );
        assert_eq!(grants("x"), [(real(&package), Ro), (real(&project), Ro)]);
        let x = parsed.server("x").unwrap();
        let crate::config::ServerKind::Native {
            measure, command, ..
        } = &x.kind
        else {
            panic!("native");
        };
        assert_eq!(measure, &[real(&package)]);
        // Issue 33: a bare name is written as the file it was on PATH, so
        // an agent's other PATH cannot run another file under that name.
        let node = resolve("node", Path::new("/"), std::env::var_os("PATH").as_deref()).unwrap();
        assert_eq!(Path::new(command), node.found);
        assert!(
            imported
                .skipped
                .iter()
                .any(|n| n.contains("`node` is ") && n.contains("on Moat's PATH at import")),
            "{:?}",
            imported.skipped
        );
        assert_eq!(x.env_passthrough, ["API_KEY", "GITHUB_TOKEN"]);
        assert_eq!(x.env.get("LOG_LEVEL").map(String::as_str), Some("debug"));
        let notes = imported.skipped.join("\n");
        assert!(
            notes.contains("`x`: env GITHUB_TOKEN looks like a secret: its value was not copied"),
            "{notes}"
        );
    }

    /// Issue 33: what a writer writes is granted read-write with no hand
    /// edit: a directory in its arguments, a path in its env, and a file
    /// (its database, its graph, one it is yet to create) by its directory,
    /// where a journal or a new copy goes beside it. A reader's stay
    /// read-only, and a file in a directory no implicit grant may be is
    /// granted alone.
    #[test]
    fn writers_data_is_granted_read_write_from_arguments_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let real = |p: &Path| std::fs::canonicalize(p).unwrap();
        let workbooks = dir.path().join("workbooks");
        let graph = dir.path().join("graph");
        let db = dir.path().join("db");
        for d in [&workbooks, &graph, &db] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(db.join("birds.db"), "").unwrap();
        let file = dir.path().join("claude.json");
        std::fs::write(
            &file,
            serde_json::json!({"mcpServers": {
                "excel": {"command": "/nonexistent/excel-mcp-server", "args": ["stdio", "--allow-dir", workbooks]},
                "graph": {"command": "/nonexistent/mcp-knowledge-graph",
                          "env": {"MEMORY_FILE_PATH": graph.join("memory.jsonl"), "LOG_LEVEL": "debug", "API_KEY": "/not/a/grant"}},
                "sqlite": {"command": "/nonexistent/mcp-server-sqlite", "args": ["--db-path", db.join("birds.db")]},
                "reader": {"command": "/nonexistent/reader", "args": [workbooks, graph.join("gone.db")],
                           "env": {"DATA": db.join("birds.db")}},
                "root": {"command": "/nonexistent/mcp-server-sqlite", "args": ["--db-path", "/nonexistent-moat.db"]}
            }})
            .to_string(),
        )
        .unwrap();
        let imported = import(&file, None, None).unwrap();
        let parsed = crate::config::Config::parse(&dir.path().join("moat.toml"), &imported.toml)
            .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
        let grants = |name: &str| -> Vec<(PathBuf, crate::grants::DirMode)> {
            parsed
                .server(name)
                .unwrap()
                .dirs
                .iter()
                .map(|d| (d.host.clone(), d.mode))
                .collect()
        };
        use crate::grants::DirMode::{Ro, Rw};
        assert_eq!(grants("excel"), [(real(&workbooks), Rw)]);
        assert_eq!(grants("graph"), [(real(&graph), Rw)], "{}", imported.toml);
        assert_eq!(grants("sqlite"), [(real(&db), Rw)]);
        assert_eq!(
            grants("reader"),
            [(real(&workbooks), Ro), (real(&db.join("birds.db")), Ro)]
        );
        assert!(grants("root").is_empty(), "{}", imported.toml);
        let notes = imported.skipped.join("\n");
        assert!(
            notes.contains(&format!(
                "`graph`: grants read-write {}, the directory of {} (named in its env MEMORY_FILE_PATH)",
                real(&graph).display(),
                graph.join("memory.jsonl").display()
            )),
            "{notes}"
        );
        assert!(
            notes.contains("`root`: /nonexistent-moat.db (named in its arguments) is a file it writes, but its directory / is not granted"),
            "{notes}"
        );
    }

    /// Issue 33: a launcher option Moat does not know is named, with the
    /// entry, and nothing is installed under a guess at what it meant.
    #[test]
    fn an_unknown_launcher_option_is_named_with_its_entry() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("claude.json");
        std::fs::write(
            &file,
            r#"{"mcpServers": {
                "time": {"command": "uvx", "args": ["--python", "3.12", "mcp-server-time"]},
                "memory": {"command": "npx", "args": ["-y", "--registry", "https://r.example", "@modelcontextprotocol/server-memory"]}
            }}"#,
        )
        .unwrap();
        let store = dir.path().join("store");
        let imported = import(&file, None, Some(&store)).unwrap();
        let notes = imported.skipped.join("\n");
        assert!(
            notes.contains("`time`: `uvx`: option --python is not understood by Moat's import (it knows --from PKG, --with REQ and -q)"),
            "{notes}"
        );
        assert!(
            notes.contains("`memory`: `npx`: option --registry is not understood"),
            "{notes}"
        );
        assert!(!store.exists(), "nothing was installed");
        let parsed = crate::config::Config::parse(&dir.path().join("moat.toml"), &imported.toml)
            .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
        let time = parsed.server("time").unwrap();
        assert!(time.package.is_none());
        assert_eq!(time.args, ["--python", "3.12", "mcp-server-time"]);
    }

    #[test]
    fn vs_code_config_and_bad_input() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mcp.json");
        std::fs::write(&file, r#"{"servers": {"a": {"type": "stdio", "command": "sh"}, "b": {"type": "http", "url": "http://127.0.0.1:1/mcp"}}}"#).unwrap();
        let imported = import(&file, std::env::var_os("PATH").as_deref(), None).unwrap();
        assert!(imported.toml.contains("[servers.a]"));
        assert!(!imported.toml.contains("[servers.b]"));
        std::fs::write(&file, "{}").unwrap();
        assert!(matches!(
            import(&file, None, None),
            Err(ImportError::Format { .. })
        ));
        assert_eq!(server_name("a__b c"), "a_b-c");
    }
}
