//! `moat add` and `moat update`: servers installed from packages, added to
//! moat.toml and moved to a newer version with the diff shown first.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use moat_host::Config;
use moat_host::lock::{Lock, LockedTool};
use moat_host::packages;
use moat_host::text::printable;

/// `moat add`: imports `command args` as one server and appends it to the
/// config (created when missing).
pub fn add(
    config_path: &Path,
    name: Option<&str>,
    command: &[String],
    install: bool,
    replace: bool,
) -> Result<ExitCode> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| anyhow!("moat add: give the server's command after `--`"))?;
    let existing = match std::fs::read_to_string(config_path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => return Err(error).context(format!("reading {}", config_path.display())),
    };
    let configured = if existing.is_empty() {
        None
    } else {
        Some(Config::parse(config_path, &existing)?)
    };
    let taken = |name: &str| {
        configured
            .as_ref()
            .is_some_and(|config| config.servers.contains_key(name))
    };
    // A name given and taken is refused before anything is installed.
    if let Some(name) = name
        && taken(name)
        && !replace
    {
        bail!(
            "{}: a server named `{name}` is already configured (choose another with --name, or replace it with --replace)",
            config_path.display()
        );
    }
    let base = config_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let store = if install {
        Some(moat_host::dirs::store().ok_or(packages::PackageError::NoStore)?)
    } else {
        None
    };
    let path_var = std::env::var_os("PATH");
    let (name, imported) = moat_host::importer::add(
        name,
        program,
        args,
        base,
        path_var.as_deref(),
        store.as_deref(),
    );
    let replaced = taken(&name);
    if replaced && !replace {
        bail!(
            "{}: a server named `{name}` is already configured (choose another with --name, or replace it with --replace)",
            config_path.display()
        );
    }
    let existing = if replaced {
        without_server(&existing, &name)
            .with_context(|| format!("taking `{name}` out of {}", config_path.display()))?
    } else {
        existing
    };
    let combined = if existing.is_empty() || existing.ends_with("\n\n") {
        format!("{existing}{}", imported.toml)
    } else if existing.ends_with('\n') {
        format!("{existing}\n{}", imported.toml)
    } else {
        format!("{existing}\n\n{}", imported.toml)
    };
    Config::parse(config_path, &combined)
        .context("the new entry would not be a valid moat.toml")?;
    std::fs::write(config_path, combined)
        .with_context(|| format!("writing {}", config_path.display()))?;
    for line in &imported.skipped {
        eprintln!("moat: add: {}", printable(line));
    }
    println!(
        "{} server `{name}` {} {}; run `moat lock` to pin its tools",
        if replaced { "replaced" } else { "added" },
        if replaced { "in" } else { "to" },
        config_path.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `moat update`: installs the newest (or the given) version of a server's
/// package, prints the version and tool diff against what is pinned, and
/// re-pins (moat.toml and moat.lock) only with `yes`.
pub async fn update(
    config_path: &Path,
    server: &str,
    version: Option<&str>,
    yes: bool,
) -> Result<ExitCode> {
    let config = Config::load(config_path)?;
    let spec = config.server(server)?;
    let record = spec.package.clone().ok_or_else(|| {
        anyhow!(
            "server `{server}` was not installed by Moat (its entry has no [servers.{server}.package]): nothing to update; `moat add -- npx -y PKG` installs one"
        )
    })?;
    let store = record
        .store
        .parent()
        .ok_or_else(|| anyhow!("{}: not inside a store", record.store.display()))?;
    let path_var = std::env::var_os("PATH");
    let request = record.request();
    let installed = tokio::task::spawn_blocking({
        let store = store.to_owned();
        let version = version.map(str::to_owned);
        // `moat update` is the asking: it always resolves anew.
        move || {
            packages::install(
                &store,
                &request,
                version.as_deref(),
                path_var.as_deref(),
                false,
            )
        }
    })
    .await??;
    let new_spec = packages::respec(spec, &installed).ok_or_else(|| {
        anyhow!(
            "server `{server}`: its args no longer start with the package's entry {:?}; re-add it with `moat add`",
            record.entry_args
        )
    })?;
    let same = installed.record.lockfile_sha256 == record.lockfile_sha256;
    println!(
        "{server}: {} {} -> {}{}",
        record.name,
        record.version,
        installed.record.version,
        if same { " (unchanged)" } else { "" }
    );
    let host = crate::new_host(config_path)?;
    let lock_path = Lock::path_for(config_path);
    let mut lock = Lock::load(&lock_path)?;
    let before: Vec<LockedTool> = match lock.as_ref().and_then(|l| l.servers.get(server)) {
        Some(locked) => locked.tools.clone(),
        None if record.store.is_dir() => {
            host.measure(spec)
                .await
                .with_context(|| {
                    format!("listing the tools of {} {}", record.name, record.version)
                })?
                .tools
        }
        None => Vec::new(),
    };
    let after = host.measure(&new_spec).await.with_context(|| {
        format!(
            "starting {} {} to list its tools",
            record.name, installed.record.version
        )
    })?;
    let changes = tool_diff(&before, &after.tools);
    if changes.is_empty() {
        println!("tools: no change ({} tools)", after.tools.len());
    } else {
        println!("tools:");
        for change in &changes {
            println!("  {}", printable(change));
        }
    }
    if same
        && lock
            .as_ref()
            .is_none_or(|l| l.servers.get(server) == Some(&after))
    {
        println!("nothing to re-pin");
        return Ok(ExitCode::SUCCESS);
    }
    if !yes {
        println!(
            "not re-pinned: moat.toml and moat.lock are unchanged; run `moat update {server}{} --yes` to re-pin",
            version
                .map(|v| format!(" --version {v}"))
                .unwrap_or_default()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let text = std::fs::read_to_string(config_path)
        .with_context(|| format!("reading {}", config_path.display()))?;
    let repinned = packages::repin_config(config_path, &text, server, &new_spec)?;
    std::fs::write(config_path, repinned)
        .with_context(|| format!("writing {}", config_path.display()))?;
    println!("re-pinned `{server}` in {}", config_path.display());
    if let Some(lock) = lock.as_mut() {
        // Measure again as the config now reads, so the lock holds the
        // grants' inodes and identity of exactly that entry.
        let config = Config::load(config_path)?;
        let locked = host.measure(config.server(server)?).await?;
        lock.servers.insert(server.to_owned(), locked);
        moat_host::lock::flag_cross_server_references(lock);
        lock.write(&lock_path)?;
        println!("re-pinned `{server}` in {}", lock_path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per tool added, removed or changed between two listings.
fn tool_diff(before: &[LockedTool], after: &[LockedTool]) -> Vec<String> {
    let by_name = |tools: &[LockedTool]| -> BTreeMap<String, String> {
        tools
            .iter()
            .map(|t| (t.name.clone(), t.definition.clone()))
            .collect()
    };
    let (before, after) = (by_name(before), by_name(after));
    let mut out = Vec::new();
    for (name, definition) in &after {
        match before.get(name) {
            None => out.push(format!("+ {name} (new)")),
            Some(old) if old != definition => out.push(format!("~ {name} (definition changed)")),
            Some(_) => {}
        }
    }
    for name in before.keys().filter(|n| !after.contains_key(*n)) {
        out.push(format!("- {name} (removed)"));
    }
    out
}

/// `text` (a moat.toml) without server `name`'s tables, the rest kept as
/// written.
fn without_server(text: &str, name: &str) -> Result<String> {
    let mut doc: toml_edit::DocumentMut = text.parse()?;
    let removed = doc
        .get_mut("servers")
        .and_then(toml_edit::Item::as_table_like_mut)
        .and_then(|servers| servers.remove(name));
    if removed.is_none() {
        bail!("no [servers.{name}] table");
    }
    Ok(doc.to_string())
}
