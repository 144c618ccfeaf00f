//! On `attack`, forks a child that forks a grandchild; both then sleep
//! forever. Answers with their pids. The host must leave none behind when it
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
    Command::new(exe)
        .arg(role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn")
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("grandchild") => sleep_forever(),
        Some("child") => {
            let grandchild = spawn_self("grandchild");
            println!("{}", grandchild.id());
            sleep_forever()
        }
        _ => hostile::serve("fork-tree", |id: &serde_json::Value| {
            let mut child = spawn_self("child");
            let mut line = String::new();
            let stdout = child.stdout.take().expect("child stdout");
            BufReader::new(stdout).read_line(&mut line).expect("read");
            let pids = format!("{} {}", child.id(), line.trim());
            Some(hostile::text_result(id, &pids))
        }),
    }
}
