//! Recognising a launcher command (`npx`, `bunx`, `pnpm dlx`, `uvx`,
//! `pipx run`, `python -m`) as a [`Request`]: its options, the package or
//! packages it names and the program it runs. Each package named is read
//! as a requirement by [`super::requirement`].

use super::requirement::requirement;
use super::{Ecosystem, Entry, PackageError, Request};

pub(super) fn arguments(launcher: &str, detail: impl Into<String>) -> PackageError {
    PackageError::Arguments {
        launcher: launcher.to_owned(),
        detail: detail.into(),
    }
}

/// Recognises `command args` as a package launcher: `npx`, `bunx`,
/// `pnpm dlx`, `uvx`, `pipx run` or `python -m` (any path to them).
/// `None` for any other command.
pub fn recognise(command: &str, args: &[String]) -> Option<Result<Request, PackageError>> {
    let base = command.rsplit('/').next().unwrap_or(command);
    let python = base == "python" || base == "python3" || base.starts_with("python3.");
    let (ecosystem, rest) = match base {
        "npx" | "bunx" => (Ecosystem::Npm, args),
        "pnpm" if args.first().map(String::as_str) == Some("dlx") => (Ecosystem::Npm, &args[1..]),
        "uvx" => (Ecosystem::Python, args),
        "pipx" if args.first().map(String::as_str) == Some("run") => {
            (Ecosystem::Python, &args[1..])
        }
        _ if python && args.first().map(String::as_str) == Some("-m") => {
            return Some(python_module(base, &args[1..]));
        }
        _ => return None,
    };
    let launcher = if rest.len() < args.len() {
        format!("{base} {}", args[0])
    } else {
        base.to_owned()
    };
    Some(launcher_request(ecosystem, &launcher, rest))
}

fn python_module(base: &str, args: &[String]) -> Result<Request, PackageError> {
    let launcher = format!("{base} -m");
    let module = args
        .first()
        .filter(|m| {
            !m.is_empty()
                && m.chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
        })
        .ok_or_else(|| arguments(&launcher, "expected a module name after -m"))?;
    Ok(Request {
        ecosystem: Ecosystem::Python,
        name: module.split('.').next().unwrap_or(module).replace('_', "-"),
        extras: Vec::new(),
        version: None,
        with: Vec::new(),
        entry: Entry::Module(module.clone()),
        args: args[1..].to_vec(),
        launcher,
    })
}

/// What a launcher's option does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flag {
    /// Takes no value and changes nothing Moat does.
    Quiet,
    /// Names the package to install (repeatable for npm: `-p a -p b`);
    /// the positional argument is then the program to run.
    Package,
    /// Names another requirement to install beside it (`uvx --with`).
    With,
}

/// The options a launcher takes that Moat understands; any other is
/// refused by name rather than guessed at.
fn flag(launcher: &str, name: &str) -> Option<Flag> {
    let program = launcher.split(' ').next().unwrap_or(launcher);
    match (program, name) {
        (_, "-y" | "--yes" | "-q" | "--quiet" | "--silent") => Some(Flag::Quiet),
        ("bunx", "--bun") => Some(Flag::Quiet),
        ("npx" | "bunx" | "pnpm", "-p" | "--package") => Some(Flag::Package),
        ("uvx", "--from") => Some(Flag::Package),
        ("uvx", "--with") => Some(Flag::With),
        ("pipx", "--spec") => Some(Flag::Package),
        _ => None,
    }
}

fn launcher_request(
    ecosystem: Ecosystem,
    launcher: &str,
    args: &[String],
) -> Result<Request, PackageError> {
    let mut packages: Vec<String> = Vec::new();
    let mut with: Vec<String> = Vec::new();
    let mut index = 0;
    while let Some(arg) = args.get(index) {
        index += 1;
        if arg == "--" {
            break;
        }
        if !arg.starts_with('-') {
            index -= 1;
            break;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        let kind = flag(launcher, name).ok_or_else(|| {
            arguments(
                launcher,
                format!(
                    "option {name} is not understood by Moat's import (it knows {}); run the package's program directly",
                    known_flags(launcher)
                ),
            )
        })?;
        if kind == Flag::Quiet {
            if inline.is_some() {
                return Err(arguments(launcher, format!("option {name} takes no value")));
            }
            continue;
        }
        let value = match inline {
            Some(value) => value,
            None => {
                index += 1;
                args.get(index - 1).cloned().ok_or_else(|| {
                    arguments(launcher, format!("option {name} needs a package after it"))
                })?
            }
        };
        match kind {
            Flag::Package if ecosystem == Ecosystem::Python && !packages.is_empty() => {
                return Err(arguments(
                    launcher,
                    format!(
                        "option {name} is given more than once; name other requirements with --with"
                    ),
                ));
            }
            Flag::Package => packages.push(value),
            Flag::With => with.push(value),
            Flag::Quiet => {}
        }
    }
    let positional = args.get(index).cloned();
    let rest = args.get(index + 1..).unwrap_or_default().to_vec();
    let (specs, program) = match (packages.is_empty(), positional) {
        (false, Some(program)) => (packages, Some(program)),
        (true, Some(package)) => (vec![package], None),
        (false, None) => {
            return Err(arguments(
                launcher,
                "the package is named with an option, but no program to run from it follows",
            ));
        }
        (true, None) => return Err(arguments(launcher, "no package is named")),
    };
    let mut requirements = specs
        .iter()
        .map(|spec| requirement(ecosystem, launcher, spec))
        .collect::<Result<Vec<_>, _>>()?;
    // Of several npm packages, the one run is the one named like the
    // program, else the first; the others are installed beside it.
    let primary = program
        .as_deref()
        .and_then(|program| {
            requirements
                .iter()
                .position(|r| r.name.rsplit('/').next() == Some(program))
        })
        .unwrap_or(0);
    let main = requirements.remove(primary);
    let mut extra: Vec<String> = requirements.iter().map(|r| r.render(ecosystem)).collect();
    for spec in &with {
        extra.push(requirement(ecosystem, launcher, spec)?.render(ecosystem));
    }
    let entry = match (ecosystem, program) {
        (_, Some(program)) => Some(program),
        // uvx and pipx run the console script named like the package.
        (Ecosystem::Python, None) => Some(main.name.clone()),
        (Ecosystem::Npm, None) => None,
    };
    Ok(Request {
        ecosystem,
        name: main.name,
        extras: main.extras,
        version: main.version,
        with: extra,
        entry: Entry::Program(entry),
        args: rest,
        launcher: launcher.to_owned(),
    })
}

/// The options [`flag`] knows for `launcher`, for an error message.
fn known_flags(launcher: &str) -> String {
    let program = launcher.split(' ').next().unwrap_or(launcher);
    match program {
        "uvx" => "--from PKG, --with REQ and -q",
        "pipx" => "--spec PKG and -q",
        "bunx" => "-p/--package PKG, --bun and -y",
        _ => "-p/--package PKG and -y",
    }
    .to_owned()
}

#[cfg(test)]
mod tests;
