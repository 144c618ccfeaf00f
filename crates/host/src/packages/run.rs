//! Running an installer: its output kept for an error, a line on stderr
//! every so often saying how far it has got, and one more try when it
//! failed on what its output names as a network error.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use super::PackageError;

/// How often a running install says how far it has got.
pub(super) const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs an installer for `package`, writing into `dir`: every
/// [`PROGRESS_EVERY`] a line on stderr says how long it has run and how
/// much it has written, and its end says how long it took.
pub(super) fn run(package: &str, command: &mut Command, dir: &Path) -> Result<(), PackageError> {
    run_telling(package, command, dir, PROGRESS_EVERY, &mut |line| {
        eprintln!("{line}")
    })
}

/// Output of npm and pip that names a failure of the network or of the
/// registry's servers, not of the package: such an install is tried once
/// more. npm prints `code E…` for its errors (E503 is the registry's
/// answer); pip names urllib3's and Python's exceptions.
const TRANSIENT: &[&str] = &[
    "code ECONNRESET",
    "code ETIMEDOUT",
    "code EAI_AGAIN",
    "code ENOTFOUND",
    "code ECONNREFUSED",
    "code ERR_SOCKET_TIMEOUT",
    "code EPIPE",
    "code E500",
    "code E502",
    "code E503",
    "code E504",
    "ReadTimeoutError",
    "ConnectionResetError",
    "Temporary failure in name resolution",
    "RemoteDisconnected",
    "IncompleteRead",
];

/// The first network error `output` names, if any.
fn transient(output: &str) -> Option<&'static str> {
    TRANSIENT.iter().copied().find(|mark| output.contains(mark))
}

pub(super) fn run_telling(
    package: &str,
    command: &mut Command,
    dir: &Path,
    every: std::time::Duration,
    tell: &mut dyn FnMut(String),
) -> Result<(), PackageError> {
    let first = attempt(package, command, dir, every, tell);
    let mark = match &first {
        Err(PackageError::Installer { output, .. }) => transient(output),
        _ => None,
    };
    let Some(mark) = mark else {
        return first;
    };
    tell(format!(
        "moat: installing {package} failed on a network error (`{mark}`); trying once more"
    ));
    attempt(package, command, dir, every, tell)
}

fn attempt(
    package: &str,
    command: &mut Command,
    dir: &Path,
    every: std::time::Duration,
    tell: &mut dyn FnMut(String),
) -> Result<(), PackageError> {
    use std::io::Read;
    let shown = format!("{command:?}").replace('"', "");
    let started = std::time::Instant::now();
    let program = command.get_program().to_string_lossy().into_owned();
    let spawn_error = |source| PackageError::Spawn {
        package: package.to_owned(),
        program: program.clone(),
        source,
    };
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let (done, finished) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = child.wait();
        let _ = done.send(());
        status
    });
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(every) {
        tell(format!(
            "moat: still installing {package}: {} s, {} written so far",
            started.elapsed().as_secs(),
            human_bytes(tree_bytes(dir))
        ));
    }
    let status = waiter
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the installer's waiter panicked")))
        .map_err(|source| PackageError::Spawn {
            package: package.to_owned(),
            program: shown.clone(),
            source,
        })?;
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if status.success() {
        tell(format!(
            "moat: installed {package} in {:.1} s ({})",
            started.elapsed().as_secs_f64(),
            human_bytes(tree_bytes(dir))
        ));
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&stdout));
    let tail: Vec<&str> = text.lines().rev().take(12).collect();
    let mut shown_output = String::new();
    for line in tail.iter().rev() {
        let _ = write!(shown_output, "\n  {}", crate::text::printable(line));
    }
    Err(PackageError::Installer {
        package: package.to_owned(),
        command: shown,
        status: status.to_string(),
        output: shown_output,
    })
}

/// The bytes of the files under `dir` (links not followed).
pub(super) fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => pending.push(entry.path()),
                Ok(kind) if kind.is_file() => {
                    total += entry.metadata().map(|m| m.len()).unwrap_or(0);
                }
                _ => {}
            }
        }
    }
    total
}

fn human_bytes(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20)),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / f64::from(1u32 << 10)),
        b => format!("{b} B"),
    }
}
