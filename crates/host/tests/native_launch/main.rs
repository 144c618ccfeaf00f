//! Native-only checks of the native launcher: the measured launch (links,
//! changed bytes, a swap after the check), process-group cleanup checked
//! through /proc, and a real MCP server that nobody here wrote.
//!
//! Tests by topic: `measured`, `scripts`, `environment`, `errors` and
//! `third_party`; this file keeps the helpers they share.
#![cfg(target_os = "linux")]

#[path = "../common/mod.rs"]
mod common;

use common::{running, text};

use std::path::{Path, PathBuf};

use moat_host::native::{self, NativeError, NativeLaunch};
use moat_host::resolve_command as resolve;
use moat_host::{
    ConnectError, Digest, Evidence, Expectation, Handshake, Host, LaunchError, ServerSpec, Session,
};
use moat_test_guests as guests;

mod environment;
mod errors;
mod measured;
mod scripts;
mod third_party;

fn host() -> Host {
    Host::new(None).expect("host")
}

fn digest_of(path: impl AsRef<Path>) -> Digest {
    Digest::of(&std::fs::read(path).unwrap())
}

fn pinned(name: &str, path: &Path, digest: Digest) -> ServerSpec {
    let mut spec = ServerSpec::native(name, path.to_str().unwrap());
    spec.sha256 = Some(digest);
    spec
}

/// A launch of the file at `path`, pinned to `digest`, with nothing granted.
fn pinned_launch(name: &str, path: &Path, digest: Digest, cwd: PathBuf) -> NativeLaunch {
    let mut spec = ServerSpec::native(name, path.to_str().unwrap());
    if let moat_host::ServerKind::Native { cwd: dir, .. } = &mut spec.kind {
        *dir = cwd;
    }
    NativeLaunch::new(
        spec,
        resolve(path.to_str().unwrap(), Path::new("/"), None).unwrap(),
        Expectation::Pinned(digest),
    )
}

fn expect_native_error(result: Result<Session, ConnectError>) -> NativeError {
    match result {
        Err(ConnectError::Launch(LaunchError::Native(error))) => error,
        Err(other) => panic!("expected a native launch error, got {other}"),
        Ok(_) => panic!("the launch must be refused"),
    }
}

/// The real Python interpreter (not a pyenv shim, which is itself a
/// script), as `sys.executable` names it.
fn python() -> PathBuf {
    let output = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// A Python MCP server as a `#!` script whose one tool is `tool`.
fn script_server(dir: &Path, name: &str, shebang: &str, tool: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            r#"#!{shebang}
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    method, ident = message.get("method"), message.get("id")
    if method == "initialize":
        result = {{"protocolVersion": "2025-06-18", "capabilities": {{"tools": {{}}}}, "serverInfo": {{"name": "script", "version": "1"}}}}
    elif method == "tools/list":
        result = {{"tools": [{{"name": "{tool}", "inputSchema": {{"type": "object"}}}}]}}
    else:
        continue
    print(json.dumps({{"jsonrpc": "2.0", "id": ident, "result": result}}), flush=True)
"#
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// A transport that spawns `executable`, already opened and measured.
fn opened(
    launch: native::NativeLaunch,
    executable: native::MeasuredExecutable,
) -> moat_host::ServerTransport {
    let (name, limits) = (launch.spec().name.clone(), launch.spec().limits.clone());
    moat_host::Planned::NativeOpened(Box::new((launch, executable))).transport(&name, limits)
}
