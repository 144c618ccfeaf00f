//! File descriptors: a flood of idle connections and abandoned sessions
//! leaves an agent served, running out of descriptors on accept does not end
//! the server, and moat raises its soft descriptor limit to the hard one.

use super::*;

/// Raises this process's soft descriptor limit to the hard one; returns it.
fn raise_descriptor_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit write and read the one struct given.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

#[test]
fn a_flood_of_idle_connections_and_abandoned_sessions_leaves_an_agent_served() {
    let limit = raise_descriptor_limit();
    let server = Server::start(
        "max_sessions = 16\nsession_idle_ms = 10000\nmax_connections = 256\nheader_timeout_ms = 10000",
    );
    // The baseline: one agent served and gone, so the engine and the
    // component are warm.
    session_with_a_child(&server.address).unwrap();
    assert!(wait_for(Duration::from_secs(30), || server
        .audited("session_close")
        >= 1));
    let baseline = server.rss_kib();

    // 10,000 idle connections (as many as this process may open), held.
    let wanted = 10_000.min(limit.saturating_sub(200) as usize);
    let mut idle = Vec::with_capacity(wanted);
    for _ in 0..wanted {
        match TcpStream::connect(&server.address) {
            Ok(stream) => idle.push(stream),
            Err(error) => panic!("connect {} failed: {error}", idle.len()),
        }
    }
    // 1,000 sessions opened (each with a child, while there is room) and
    // abandoned.
    let mut opened = 0;
    let mut refused = 0;
    for _ in 0..1_000 {
        match session_with_a_child(&server.address) {
            Ok(_) => opened += 1,
            Err(503) => refused += 1,
            Err(other) => panic!("status {other}"),
        }
    }
    assert_eq!(opened, 16, "max_sessions bounds the sessions");
    assert_eq!(refused, 984);

    // Still flooded: a normal agent's request is evicting no one but idle
    // connections, and is served within a second once sessions have room.
    assert!(
        wait_for(Duration::from_secs(30), || server.audited("session_close")
            >= 17),
        "abandoned sessions were not closed after the idle timeout"
    );
    let start = Instant::now();
    session_with_a_child(&server.address).expect("an agent is served after the flood");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(
        server
            .refusals()
            .iter()
            .any(|(r, s)| r == "evicted-idle" && *s == 408)
    );
    drop(idle);

    // Once the idle timeout has passed again, memory is back to within 10%
    // of the baseline.
    assert!(wait_for(Duration::from_secs(30), || server
        .audited("session_close")
        >= 18));
    let settled = wait_for(Duration::from_secs(10), || {
        server.rss_kib() <= baseline + baseline / 10
    });
    assert!(
        settled,
        "RSS {} KiB against a baseline of {baseline} KiB",
        server.rss_kib()
    );
}

#[test]
fn running_out_of_descriptors_on_accept_does_not_end_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "max_connections = 1024");
    // The server gets 128 descriptors; 300 connections exhaust them.
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 128 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_moat"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--token",
            TOKEN,
            "--config",
        ])
        .arg(&config)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", common::state_dir())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines_tx.send(line);
        }
    });
    let url = lines_rx
        .iter()
        .find_map(|l| l.strip_prefix("moat: serving MCP at ").map(str::to_owned))
        .unwrap();
    let address = common::address_of(&url);
    let held: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(&address).ok())
        .collect();
    assert!(
        wait_for(Duration::from_secs(30), || lines_rx
            .try_iter()
            .any(|l| l.contains("accept failed; retrying"))),
        "the server never ran out of descriptors"
    );
    assert!(child.try_wait().unwrap().is_none(), "the server exited");
    drop(held);
    // Served again once descriptors are back.
    assert!(wait_for(Duration::from_secs(30), || post(
        &address, None, INITIALIZE
    )
    .status
        == 200));
    assert!(child.try_wait().unwrap().is_none());
    let _ = child.kill();
    let _ = child.wait();
}

/// Issue 32, item 2: Moat takes every descriptor it may have: started with
/// a soft RLIMIT_NOFILE of 256 under a higher hard limit, `moat serve`
/// runs with its soft limit raised to the hard one.
#[test]
fn moat_raises_its_soft_descriptor_limit_to_the_hard_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -S -n 256 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_moat"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--token",
            TOKEN,
            "--config",
        ])
        .arg(&config)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", common::state_dir())
        .env("RUST_LOG", "moat=debug")
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut logged = None;
    for line in std::io::BufRead::lines(stderr).map_while(Result::ok) {
        if line.contains("RLIMIT_NOFILE") {
            logged = Some(line.clone());
        }
        if line.starts_with("moat: serving MCP at ") {
            break;
        }
    }
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let open_files: Vec<&str> = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect();
    let hard = open_files[1];
    assert_eq!(open_files[0], hard, "{limits}");
    if hard != "256" {
        let logged = logged.expect("the raised limit is logged at debug");
        assert!(
            logged.contains(&format!("soft={hard}")) && logged.contains("was=256"),
            "{logged}"
        );
    }
}
