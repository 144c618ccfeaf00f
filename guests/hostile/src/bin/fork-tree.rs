//! On `attack`, forks a child that forks a grandchild; both then sleep
//! forever, with the server's own arguments after their role in their argv
//! (so a test can find them on the host by a token). Answers with their
//! pids as the server's /proc names them. The host must leave none behind when it
//! closes the session. (Native only: wasm has no processes.) Leaving them
//! unreaped is the point.
#![allow(clippy::zombie_processes)]
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

fn spawn_self(role: &str) -> std::process::Child {
    let exe = std::env::current_exe().expect("current_exe");
    // The server's own arguments go along (after the role, for a child).
    let passed: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "child" && a != "grandchild")
        .collect();
    Command::new(exe)
        .arg(role)
        .args(passed)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn")
}

/// This process's pid as its /proc names it.
fn host_pid() -> String {
    std::fs::read_link("/proc/self")
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| std::process::id().to_string())
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("grandchild") => {
            println!("{}", host_pid());
            sleep_forever()
        }
        Some("child") => {
            let mut grandchild = spawn_self("grandchild");
            let mut line = String::new();
            let stdout = grandchild.stdout.take().expect("grandchild stdout");
            BufReader::new(stdout).read_line(&mut line).expect("read");
            println!("{} {}", host_pid(), line.trim());
            sleep_forever()
        }
        _ => hostile::serve("fork-tree", |id: &serde_json::Value| {
            let mut child = spawn_self("child");
            let mut line = String::new();
            let stdout = child.stdout.take().expect("child stdout");
            BufReader::new(stdout).read_line(&mut line).expect("read");
            let pids = line.trim().to_owned();
            Some(hostile::text_result(id, &pids))
        }),
    }
}
