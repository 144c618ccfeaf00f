//! Python distributions from PyPI: installed with pip (wheels only), a
//! `requirements.txt` with every archive's hash written as the lockfile,
//! and run through `moat-entry.py` (a console script or `-m MODULE`).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::requirement::{requirement_text, split_spec};
use super::run::run;
use super::{Ecosystem, Entry, PackageError, Request};

/// pip: `pip install --target site --report` (wheels only), a
/// `requirements.txt` with every archive's hash written from the report,
/// and `moat-entry.py`, which puts `site` first on sys.path and calls the
/// console script's function (or runs the module).
pub(super) fn install_python(
    tmp: &Path,
    request: &Request,
    version: Option<&str>,
    interpreter: &Path,
    package: &str,
) -> Result<(String, String, Vec<PathBuf>), PackageError> {
    let layout = |detail: String| PackageError::Layout {
        package: package.to_owned(),
        detail,
    };
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| PackageError::Io {
            package: package.to_owned(),
            path,
            source,
        }
    };
    let requirement = requirement_text(Ecosystem::Python, &request.name, &request.extras, version);
    let report = tmp.join("report.json");
    let mut command = Command::new(interpreter);
    command
        .args([
            "-I",
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args([
            "--no-input",
            "--no-compile",
            "--only-binary=:all:",
            "--target",
        ])
        .arg(tmp.join("site"))
        .arg("--report")
        .arg(&report)
        .arg(&requirement)
        .args(&request.with);
    run(package, &mut command, tmp)?;
    let parsed: serde_json::Value = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| layout("pip wrote no readable --report".into()))?;
    let _ = std::fs::remove_file(&report);
    let mut lines = Vec::new();
    let mut exact = None;
    let normal = |n: &str| n.to_ascii_lowercase().replace(['_', '.'], "-");
    for item in parsed["install"].as_array().into_iter().flatten() {
        let name = item["metadata"]["name"].as_str().unwrap_or_default();
        let ver = item["metadata"]["version"].as_str().unwrap_or_default();
        let hash = item["download_info"]["archive_info"]["hashes"]["sha256"]
            .as_str()
            .ok_or_else(|| layout(format!("{name} {ver} came without an archive sha256")))?;
        lines.push(format!("{name}=={ver} --hash=sha256:{hash}"));
        if normal(name) == normal(&request.name) {
            exact = Some(ver.to_owned());
        }
    }
    let exact = exact.ok_or_else(|| layout(format!("pip did not install {}", request.name)))?;
    lines.sort();
    let lockfile = tmp.join("requirements.txt");
    std::fs::write(&lockfile, lines.join("\n") + "\n").map_err(io(&lockfile))?;
    let (entry, body) = match &request.entry {
        Entry::Module(module) => (
            format!("-m {module}"),
            format!(
                "import runpy\nrunpy.run_module({}, run_name=\"__main__\", alter_sys=True)\n",
                serde_json::Value::from(module.as_str())
            ),
        ),
        Entry::Program(program) => {
            let scripts = console_scripts(&tmp.join("site"), &request.name);
            let want = program.clone().unwrap_or_else(|| request.name.clone());
            // The package's own script, else (as uvx runs it) one of a
            // requirement installed beside it.
            let beside = || {
                request.with.iter().find_map(|other| {
                    let (name, _) = split_spec(Ecosystem::Python, other);
                    let name = name.split('[').next().unwrap_or(&name).to_owned();
                    console_scripts(&tmp.join("site"), &name)
                        .into_iter()
                        .find(|(script, _)| *script == want)
                })
            };
            let target = scripts
                .iter()
                .find(|(name, _)| *name == want)
                .or_else(|| (program.is_none() && scripts.len() == 1).then(|| &scripts[0]))
                .cloned()
                .or_else(beside)
                .ok_or_else(|| {
                    let names: Vec<&str> = scripts.iter().map(|(n, _)| n.as_str()).collect();
                    layout(format!(
                        "{exact} has no console script `{want}` (it has {names:?}){}",
                        if request.with.is_empty() {
                            ""
                        } else {
                            ", nor has any requirement named beside it"
                        }
                    ))
                })?;
            let (module, attr) = target.1.split_once(':').unwrap_or((&target.1, ""));
            let attr = attr.split('[').next().unwrap_or("").trim();
            (
                target.0.clone(),
                format!(
                    "import importlib\nsys.argv[0] = {}\ntarget = importlib.import_module({})\nfor part in {}.split('.'):\n    if part:\n        target = getattr(target, part)\nsys.exit(target())\n",
                    serde_json::Value::from(target.0.as_str()),
                    serde_json::Value::from(module.trim()),
                    serde_json::Value::from(attr),
                ),
            )
        }
    };
    let script = tmp.join("moat-entry.py");
    let text = format!(
        "# Written by Moat: runs {entry} of {} {exact} from site/ beside this file.\nimport os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), \"site\"))\n{body}",
        request.name
    );
    std::fs::write(&script, text).map_err(io(&script))?;
    Ok((exact, entry, vec![PathBuf::from("moat-entry.py")]))
}

/// The `[console_scripts]` of distribution `name` installed under `site`,
/// as (script, `module:attr`).
pub(super) fn console_scripts(site: &Path, name: &str) -> Vec<(String, String)> {
    let normal = |n: &str| n.to_ascii_lowercase().replace(['-', '.'], "_");
    let Ok(entries) = std::fs::read_dir(site) else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = file.strip_suffix(".dist-info") else {
            continue;
        };
        let dist = stem.rsplit_once('-').map_or(stem, |(d, _)| d);
        if normal(dist) != normal(name) {
            continue;
        }
        let text =
            std::fs::read_to_string(entry.path().join("entry_points.txt")).unwrap_or_default();
        let mut in_scripts = false;
        let mut out = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_scripts = line == "[console_scripts]";
            } else if let (true, Some((script, target))) = (in_scripts, line.split_once('=')) {
                out.push((script.trim().to_owned(), target.trim().to_owned()));
            }
        }
        return out;
    }
    Vec::new()
}
