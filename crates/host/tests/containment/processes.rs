//! The hostile server against processes: it cannot signal Moat or an
//! unrelated process, holds no privilege even when Moat is root, inherits no
//! descriptor, and cannot leave a process behind or make close wait.

use super::*;

/// Host pids of live processes whose argv holds `token`.
fn processes_with(token: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            (running(pid) && String::from_utf8_lossy(&cmdline).contains(token)).then_some(pid)
        })
        .collect()
}

#[tokio::test]
async fn signals_reach_neither_moat_nor_an_unrelated_process() {
    let neighbour = Neighbour::start().await;
    let mut unrelated = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let server = host().connect(&breakout()).await.unwrap();
    for (pid, signal, whom) in [
        (std::process::id(), libc::SIGSTOP, "Moat"),
        (unrelated.id(), libc::SIGKILL, "an unrelated process"),
    ] {
        let report = attack(
            &server,
            json!({"op": "signal", "pid": pid, "signal": signal}),
        )
        .await;
        refused(&report, libc::ESRCH, &format!("signal {signal} to {whom}"));
        neighbour.answers().await;
    }
    assert!(running(unrelated.id()), "the unrelated process survived");
    unrelated.kill().unwrap();
    unrelated.wait().unwrap();
    let _ = server.close().await;
    neighbour.close().await;
}

#[tokio::test]
async fn no_privilege_is_held_even_when_moat_is_root() {
    let neighbour = Neighbour::start().await;
    let server = host().connect(&breakout()).await.unwrap();
    let caps = attack(&server, json!({"op": "caps"})).await;
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            caps["data"][set],
            json!("0000000000000000"),
            "{set}: {caps}"
        );
    }
    assert_eq!(caps["data"]["NoNewPrivs"], json!("1"), "{caps}");
    assert_eq!(caps["data"]["Seccomp"], json!("2"), "{caps}");
    let neighbour_pid = std::process::id();
    for (op, errno) in [
        (json!({"op": "packet"}), libc::EAFNOSUPPORT),
        (json!({"op": "raw"}), libc::EPERM),
        (json!({"op": "bpf"}), libc::EPERM),
        (json!({"op": "klogctl"}), libc::EPERM),
        (json!({"op": "ptrace", "pid": neighbour_pid}), libc::EPERM),
        (json!({"op": "unshare"}), libc::EPERM),
        (json!({"op": "keyctl"}), libc::EPERM),
    ] {
        let report = attack(&server, op.clone()).await;
        refused(&report, errno, &op.to_string());
        neighbour.answers().await;
    }
    let identity = server.identity().unwrap();
    for line in [
        "enforced: PID namespace",
        "enforced: IPC, UTS and cgroup namespaces",
        "enforced: capabilities: none",
        "enforced: seccomp: EPERM for ptrace",
        "enforced: network namespace",
        "enforced: descriptors: only stdin, stdout, stderr and the measured executable",
    ] {
        assert!(
            identity.sandbox.lines().iter().any(|l| l.starts_with(line)),
            "{line} missing from {:#?}",
            identity.sandbox
        );
    }
    server.close().await.unwrap();
    neighbour.close().await;
}

#[tokio::test]
async fn a_descriptor_moat_inherited_does_not_reach_the_server() {
    use std::os::fd::AsRawFd;
    let neighbour = Neighbour::start().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "the caller's secret").unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&secret)
        .unwrap();
    let fd = file.as_raw_fd();
    // As Moat's caller might hand it: without close-on-exec.
    // SAFETY: clears the flags of a descriptor this test owns.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
    let server = host().connect(&breakout()).await.unwrap();
    let report = attack(&server, json!({"op": "fd", "fd": fd})).await;
    refused(&report, libc::EBADF, "reading the inherited descriptor");
    neighbour.answers().await;
    server.close().await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "the caller's secret"
    );
    drop(file);
    neighbour.close().await;
}

#[tokio::test]
async fn a_grandchild_that_leaves_its_session_dies_with_the_server_and_close_is_bounded() {
    let neighbour = Neighbour::start().await;
    let mut spec = breakout();
    spec.limits.close_grace_ms = 400;
    let server = host().connect(&spec).await.unwrap();
    let token = format!("moat-escape-{}", std::process::id());
    // The server ignores SIGTERM and SIGHUP and stdin EOF from now on; its
    // grandchild is in a session of its own and holds stdout and stderr.
    let report = attack(
        &server,
        json!({"op": "escape", "token": token, "deaf": true}),
    )
    .await;
    assert_eq!(report["ok"], json!(true), "{report}");
    // The server's /proc is its own PID namespace's: the grandchild is
    // found on the host by its token.
    let found = processes_with(&token);
    assert_eq!(found.len(), 1, "one grandchild: {found:?}");
    let pid = found[0];
    assert!(running(pid), "the grandchild runs before close");
    neighbour.answers().await;
    let started = Instant::now();
    server.close().await.unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2 * 400),
        "close took {took:?}, more than twice close_grace_ms"
    );
    assert!(!running(pid), "the grandchild outlived close");
    assert_eq!(processes_with(&token), Vec::<u32>::new());
    neighbour.close().await;
}
