//! Tries what it is told to and reports what happened, so tests can check
//! that a grant works and a denial fails. `attack` arguments:
//! `{"op": "read" | "write" | "list" | "connect" | "env" | "swap" | "resolve" | "proxy" | "hold",
//! "path": "...", "addr": "host:port", "name": "VAR", "target": "..."}`. `swap`
//! moves `path` aside and puts a link to `target` in its place (unix only);
//! `resolve` looks `addr` up `count` times; `proxy` reaches `addr` through
//! `CONNECT` on `$HTTPS_PROXY` and pings it; `hold` opens `count` such
//! tunnels and keeps them open until the server exits (it stops at the
//! first refusal, saying how many it holds); `exec` (native only) runs
//! `argv` (no shell) with the server's environment and answers its stdout,
//! or its exit status and stderr. With `"tool_error": true` a failure is
//! answered as a tool error (`isError`). The answer is JSON text:
//! `{"ok": true, "data": "..."}` or `{"ok": false, "error": "..."}`.
use std::io::{Read, Write};
use std::sync::Mutex;

/// The tunnels `hold` keeps open.
static HELD: Mutex<Vec<std::net::TcpStream>> = Mutex::new(Vec::new());

/// A tunnel to `addr` through `CONNECT` on `$HTTPS_PROXY`, or the proxy's
/// status line and reason.
fn tunnel(addr: &str) -> Result<std::net::TcpStream, String> {
    let proxy = std::env::var("HTTPS_PROXY").map_err(|e| format!("HTTPS_PROXY: {e}"))?;
    let proxy = proxy.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(proxy).map_err(|e| e.to_string())?;
    write!(stream, "CONNECT {addr} HTTP/1.1\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => answer.push(byte[0]),
            _ => break,
        }
    }
    let head = String::from_utf8_lossy(&answer).into_owned();
    if !head.starts_with("HTTP/1.1 200") {
        let mut body = String::new();
        let _ = stream.read_to_string(&mut body);
        return Err(format!(
            "{} {}",
            head.lines().next().unwrap_or_default(),
            body.trim()
        ));
    }
    Ok(stream)
}

use serde_json::{Value, json};

fn run(arguments: &Value) -> Result<String, String> {
    let text = |key: &str| arguments[key].as_str().unwrap_or_default().to_owned();
    match text("op").as_str() {
        "read" => std::fs::read_to_string(text("path")).map_err(|e| e.to_string()),
        "write" => std::fs::write(text("path"), b"written by probe")
            .map(|()| "written".to_owned())
            .map_err(|e| e.to_string()),
        "list" => std::fs::read_dir(text("path"))
            .map(|entries| {
                let mut names: Vec<String> = entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                names.join(",")
            })
            .map_err(|e| e.to_string()),
        "connect" => {
            let mut stream =
                std::net::TcpStream::connect(text("addr")).map_err(|e| e.to_string())?;
            stream.write_all(b"ping\n").map_err(|e| e.to_string())?;
            let mut reply = [0u8; 16];
            let n = stream.read(&mut reply).map_err(|e| e.to_string())?;
            Ok(String::from_utf8_lossy(&reply[..n]).into_owned())
        }
        "env" => std::env::var(text("name")).map_err(|e| e.to_string()),
        "hold" => {
            let count = arguments["count"].as_u64().unwrap_or(1);
            let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
            let before = held.len();
            for _ in 0..count {
                match tunnel(&text("addr")) {
                    Ok(stream) => held.push(stream),
                    Err(error) => {
                        return Err(format!("held {}, then: {error}", held.len() - before));
                    }
                }
            }
            Ok(format!("held {}", held.len() - before))
        }
        "proxy" => {
            // CONNECT `addr` through $HTTPS_PROXY, then ping it.
            let mut stream = tunnel(&text("addr"))?;
            stream.write_all(b"ping\n").map_err(|e| e.to_string())?;
            let mut reply = [0u8; 16];
            let n = stream.read(&mut reply).map_err(|e| e.to_string())?;
            Ok(String::from_utf8_lossy(&reply[..n]).into_owned())
        }
        "resolve" => {
            // `count` lookups of `addr`; the answer of the last one.
            use std::net::ToSocketAddrs;
            let count = arguments["count"].as_u64().unwrap_or(1).max(1);
            let mut last = Err(String::new());
            for _ in 0..count {
                last = text("addr")
                    .to_socket_addrs()
                    .map(|found| {
                        found
                            .map(|a| a.ip().to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .map_err(|e| e.to_string());
            }
            last
        }
        "exec" => {
            let argv: Vec<String> = arguments["argv"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let (program, rest) = argv.split_first().ok_or("exec needs argv")?;
            let output = std::process::Command::new(program)
                .args(rest)
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| format!("{program}: {e}"))?;
            let shown = |bytes: &[u8]| {
                let text = String::from_utf8_lossy(bytes);
                text.trim().chars().take(4000).collect::<String>()
            };
            if output.status.success() {
                Ok(shown(&output.stdout))
            } else {
                Err(format!(
                    "{}: {}",
                    output.status,
                    shown(&[output.stderr.as_slice(), output.stdout.as_slice()].concat())
                ))
            }
        }
        #[cfg(unix)]
        "swap" => {
            let path = text("path");
            std::fs::rename(&path, format!("{path}.old")).map_err(|e| e.to_string())?;
            std::os::unix::fs::symlink(text("target"), &path)
                .map(|()| "swapped".to_owned())
                .map_err(|e| e.to_string())
        }
        other => Err(format!("unknown op {other:?}")),
    }
}

fn main() {
    hostile::serve_with_arguments(
        "probe",
        "Tries an operation and reports",
        |id, arguments| {
            let (report, failed) = match run(arguments) {
                Ok(data) => (json!({"ok": true, "data": data}), false),
                Err(error) => (json!({"ok": false, "error": error}), true),
            };
            let mut result = hostile::text_result(id, &report.to_string());
            // With `"tool_error": true`, a failed operation is a tool
            // error, as a real server's is.
            if failed && arguments["tool_error"] == json!(true) {
                result["result"]["isError"] = json!(true);
            }
            Some(result)
        },
    );
}
