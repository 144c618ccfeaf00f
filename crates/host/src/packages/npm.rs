//! npm packages: installed with npm (`--ignore-scripts`), run from the
//! `bin` of the package (or of one named beside it).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::requirement::{requirement_text, split_spec};
use super::run::run;
use super::{Ecosystem, Entry, PackageError, Request};

/// npm: a private package.json of Moat's (so the lockfile does not name
/// the temporary directory), `npm install --save-exact --ignore-scripts`,
/// then the installed version and `bin` read from the package.
pub(super) fn install_npm(
    tmp: &Path,
    request: &Request,
    version: Option<&str>,
    path_var: Option<&OsStr>,
    package: &str,
) -> Result<(String, String, Vec<PathBuf>), PackageError> {
    let layout = |detail: String| PackageError::Layout {
        package: package.to_owned(),
        detail,
    };
    let npm = crate::command::resolve("npm", Path::new("/"), path_var)
        .map_err(|error| layout(format!("the installer: {error}")))?;
    let manifest = tmp.join("package.json");
    std::fs::write(
        &manifest,
        "{\"name\": \"moat-package\", \"private\": true}\n",
    )
    .map_err(|source| PackageError::Io {
        package: package.to_owned(),
        path: manifest.clone(),
        source,
    })?;
    let spec = requirement_text(Ecosystem::Npm, &request.name, &[], version);
    let mut command = Command::new(&npm.found);
    command
        .args([
            "install",
            "--save-exact",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
        ])
        .args(["--loglevel=error", "--no-update-notifier", "--prefix"])
        .arg(tmp)
        .arg("--")
        .arg(&spec)
        .args(&request.with);
    if let Some(path) = path_var {
        command.env("PATH", path);
    }
    run(package, &mut command, tmp)?;
    let meta = |name: &str| -> Result<serde_json::Value, PackageError> {
        let path = tmp.join("node_modules").join(name).join("package.json");
        std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| layout(format!("{} is missing or not JSON", path.display())))
    };
    let main = meta(&request.name)?;
    let exact = main["version"]
        .as_str()
        .ok_or_else(|| layout("its package.json has no version".into()))?
        .to_owned();
    let wanted = match &request.entry {
        Entry::Program(program) => program.clone(),
        Entry::Module(_) => None,
    };
    // The program is the package's own; one named with `-p` beside it
    // (`npx -p a -p b PROG`) may come from any of them, as npx runs it.
    let mut found =
        bin_of(&request.name, &main, wanted.as_deref()).map(|b| (request.name.clone(), b));
    if let (None, Some(_)) = (&found, &wanted) {
        for other in &request.with {
            let (name, _) = split_spec(Ecosystem::Npm, other);
            if let Some(bin) = bin_of(&name, &meta(&name)?, wanted.as_deref()) {
                found = Some((name, bin));
                break;
            }
        }
    }
    let Some((owner, (bin, script))) = found else {
        let unscoped = request.name.rsplit('/').next().unwrap_or(&request.name);
        return Err(layout(match &main["bin"] {
            serde_json::Value::Object(bins) => format!(
                "{exact} has no program {} among its bins {:?}{}",
                wanted.as_deref().unwrap_or(unscoped),
                bins.keys().collect::<Vec<_>>(),
                if request.with.is_empty() {
                    ""
                } else {
                    ", nor has any package named beside it"
                }
            ),
            serde_json::Value::String(_) => format!(
                "{exact} has no program {} (its one bin is `{unscoped}`){}",
                wanted.as_deref().unwrap_or(unscoped),
                if request.with.is_empty() {
                    ""
                } else {
                    ", nor has any package named beside it"
                }
            ),
            _ => format!("{exact} declares no `bin` to run"),
        }));
    };
    let relative = Path::new("node_modules").join(&owner).join(&script);
    let normal = relative.components().all(|c| {
        matches!(
            c,
            std::path::Component::Normal(_) | std::path::Component::CurDir
        )
    });
    if !normal || !tmp.join(&relative).is_file() {
        return Err(layout(format!(
            "bin `{bin}` names {script:?}, which is not a file inside the package"
        )));
    }
    Ok((exact, bin, vec![relative]))
}

/// The `bin` of npm package `name` (its `package.json` is `meta`) that
/// runs `wanted` (`None`: its only one, or the one named like the
/// package), as (bin name, script path inside the package).
fn bin_of(name: &str, meta: &serde_json::Value, wanted: Option<&str>) -> Option<(String, String)> {
    let unscoped = name.rsplit('/').next().unwrap_or(name);
    match &meta["bin"] {
        serde_json::Value::String(script) if wanted.is_none_or(|w| w == unscoped) => {
            Some((unscoped.to_owned(), script.clone()))
        }
        serde_json::Value::Object(bins) => {
            let pick = match wanted {
                Some(want) => bins.get_key_value(want),
                None if bins.len() == 1 => bins.iter().next(),
                None => bins.get_key_value(unscoped),
            };
            match pick {
                Some((name, serde_json::Value::String(script))) => {
                    Some((name.clone(), script.clone()))
                }
                _ => None,
            }
        }
        _ => None,
    }
}
