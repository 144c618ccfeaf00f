//! Past one machine (issue 36): three `moat serve --replica` processes and
//! two `moat node serve` launch hosts on loopback, behind HAProxy running
//! the project's own `deploy/haproxy/haproxy.cfg` unchanged.
//!
//! - Many agents at once (tests/clients/py_replicas.py): stateless
//!   2026-07-28 calls, calls parked for input, tasks, 2025 sessions and
//!   subscriptions, beside the official Python SDK on both eras and the
//!   TypeScript SDK (before the kill and after). Every
//!   answer names the replica that gave it, and each must be the one that
//!   holds the state the request names.
//! - One replica is killed mid-run (SIGKILL): every agent whose state it
//!   held fails at once with an answer naming it, every other agent
//!   finishes, and new agents land on the live replicas.
//! - Every replica's audit log verifies afterwards, the killed one's too.
//! - A revocation written to the config volume the replicas share (laid
//!   out as the kubelet writes a ConfigMap) refuses the tool on every
//!   replica.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::node::{HANG, Node, TOKEN, cache, moat, ok, start_node};
use moat_test_guests as guests;

mod common;

/// The replicas' names: the server names in deploy/haproxy/haproxy.cfg.
const REPLICAS: [&str; 3] = ["front-0", "front-1", "front-2"];

/// A child process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One `moat serve --http --replica` process.
struct Replica {
    name: &'static str,
    process: Running,
    address: String,
    audit: PathBuf,
}

fn project() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A free port on loopback, for HAProxy's listener.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A node in `dir/NAME` holding profile `rounds` (the wasm test server
/// that names itself `label`), locked, with room for many launches at once.
fn node(dir: &Path, name: &str, label: &str) -> Node {
    let home = dir.join(name);
    std::fs::create_dir_all(&home).unwrap();
    let config = home.join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[serve]\nmax_sessions = 400\n\n[servers.rounds]\nwasm = {:?}\nallow_unmeasured = true\n[servers.rounds.env]\nROUNDS_NAME = {label:?}\n",
            guests::ROUNDS_WASM
        ),
    )
    .unwrap();
    ok(
        &moat(
            &["lock", "--config", config.to_str().unwrap()],
            &home.join("state"),
            &[],
        ),
        "moat lock on a node",
    );
    start_node(dir, &config, name)
}

/// The front config the replicas share: `nodes` as `n0`, `n1` (each
/// naming itself so), the wasm test server `wasm`, and the rounds server
/// as `r` (wasm, 2026-07-28) and `o` (native, 2025-06-18).
fn front_toml(nodes: &[&Node]) -> String {
    let mut toml = String::from("[serve]\nmax_sessions = 400\n\n");
    for (n, node) in nodes.iter().enumerate() {
        toml += &format!(
            "[nodes.n{n}]\nurl = {:?}\ncert_sha256 = {:?}\npublic_key = {:?}\ntoken_env = \"NODE_TOKEN\"\n\n\
             [servers.n{n}]\nnode = \"n{n}\"\nprofile = \"rounds\"\nrevision = {:?}\n\n",
            node.url,
            node.cert_sha256,
            node.public_key,
            node.revision("rounds"),
        );
    }
    toml += &format!(
        "[servers.wasm]\nwasm = {:?}\nallow_unmeasured = true\n\n\
         [servers.r]\nwasm = {:?}\nallow_unmeasured = true\n[servers.r.env]\nROUNDS_NAME = \"r\"\n\n\
         [servers.o]\ncommand = {:?}\nallow_unmeasured = true\n[servers.o.env]\nROUNDS_NAME = \"o\"\nROUNDS_REVISION = \"2025-06-18\"\n",
        guests::EVERYTHING_WASM,
        guests::ROUNDS_WASM,
        guests::ROUNDS_NATIVE,
    );
    toml
}

/// A directory laid out as the kubelet writes a ConfigMap volume: each
/// file a link through `..data` to a timestamped directory. Returns the
/// config's path in it.
fn volume(dir: &Path, files: &[(&str, &[u8])]) -> PathBuf {
    let volume = dir.join("volume");
    std::fs::create_dir_all(&volume).unwrap();
    let version = volume.join("..2026_12_06_00");
    std::fs::create_dir(&version).unwrap();
    for (name, bytes) in files {
        std::fs::write(version.join(name), bytes).unwrap();
        std::os::unix::fs::symlink(format!("..data/{name}"), volume.join(name)).unwrap();
    }
    std::os::unix::fs::symlink("..2026_12_06_00", volume.join("..data")).unwrap();
    volume.join("moat.toml")
}

/// Updates the volume as the kubelet does: a new directory, and a new
/// `..data` link renamed over the old one.
fn update_volume(volume: &Path, files: &[(&str, Vec<u8>)]) {
    let version = volume.join("..2026_12_06_01");
    std::fs::create_dir(&version).unwrap();
    for (name, bytes) in files {
        std::fs::write(version.join(name), bytes).unwrap();
    }
    std::os::unix::fs::symlink("..2026_12_06_01", volume.join("..data_tmp")).unwrap();
    std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).unwrap();
}

/// Starts replica `name` of `config`, its state and audit log in `dir`.
fn replica(dir: &Path, config: &Path, name: &'static str, extra: &[&str]) -> Replica {
    let state = dir.join(format!("{name}-state"));
    let audit = dir.join(format!("{name}-audit.jsonl"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--replica",
            name,
            "--config",
        ])
        .arg(config)
        .arg("--audit")
        .arg(&audit)
        .args(extra)
        .env("MOAT_CACHE_DIR", cache())
        .env("MOAT_STATE_DIR", &state)
        .env("NODE_TOKEN", TOKEN)
        .stderr(Stdio::piped())
        .spawn()
        .expect("moat serve --replica");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let announced = format!(" as replica {name}");
    let address = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| {
            line.strip_prefix("moat: serving MCP at http://")?
                .strip_suffix(&announced)?
                .strip_suffix("/mcp")
                .map(str::to_owned)
        })
        .expect("moat serve announces its address and replica");
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            eprintln!("[{name}] {line}");
        }
    });
    Replica {
        name,
        process: Running(child),
        address,
        audit,
    }
}

/// HAProxy with the project's config, in front of `replicas`; its address.
fn haproxy(replicas: &[Replica]) -> (Running, String) {
    let bind = format!("127.0.0.1:{}", free_port());
    let mut command = Command::new("haproxy");
    command
        .arg("-db")
        .arg("-f")
        .arg(project().join("deploy/haproxy/haproxy.cfg"))
        .env("MOAT_LB_BIND", &bind)
        .stdout(Stdio::null());
    for (n, replica) in replicas.iter().enumerate() {
        command.env(format!("MOAT_FRONT_{n}"), &replica.address);
    }
    let child = command
        .spawn()
        .expect("haproxy (Debian's package; tests/setup.sh installs it)");
    let mut running = Running(child);
    // Up once it answers a probe through to a replica.
    let began = Instant::now();
    while get(&bind, "/healthz").is_none_or(|(status, _)| status != 200) {
        if let Some(status) = running.0.try_wait().unwrap() {
            panic!("haproxy exited ({status}) before serving: see its stderr above");
        }
        assert!(began.elapsed() < HANG, "haproxy never answered on {bind}");
        std::thread::sleep(Duration::from_millis(20));
    }
    (running, bind)
}

/// `GET path` at `address`: the status and the `Moat-Replica` header.
fn get(address: &str, path: &str) -> Option<(u16, Option<String>)> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(HANG)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let replica = response
        .lines()
        .find_map(|l| l.strip_prefix("moat-replica: "))
        .map(str::to_owned);
    Some((status, replica))
}

/// One stateless 2026-07-28 `tools/call` of `tool` at `address`: the
/// status, the answering replica and the JSON-RPC answer.
fn stateless_call(address: &str, tool: &str) -> (u16, Option<String>, serde_json::Value) {
    use std::io::Read;
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {
            "name": tool, "arguments": {"a": 40, "b": 2},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    })
    .to_string();
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(HANG)).unwrap();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    common::http_answer(&response, "moat-replica")
}

fn python_path() -> PathBuf {
    project().join("target/py")
}

/// An agent on the official TypeScript SDK through the balancer at `lb`
/// (tests/clients/ts_replicas.mjs): its report.
fn ts_agent(lb: &str) -> serde_json::Value {
    let output = Command::new("node")
        .arg(project().join("tests/clients/ts_replicas.mjs"))
        .arg(project().join("target/npm/node_modules/@modelcontextprotocol/sdk"))
        .arg(format!("http://{lb}/mcp"))
        .output()
        .expect("node (tests/setup.sh installs it and the SDK)");
    assert!(
        output.status.success(),
        "the TypeScript agent: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["ask"], "o: hello Ts and Ts (elicited)", "{report}");
    assert!(
        report["job"].as_str().unwrap().starts_with("n0: job done"),
        "{report}"
    );
    assert_eq!(report["updated"], "rounds://r/data", "{report}");
    report
}

#[test]
fn three_replicas_behind_haproxy_route_every_request_to_its_state_and_survive_losing_one() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = [
        node(dir.path(), "node0", "n0"),
        node(dir.path(), "node1", "n1"),
    ];
    let config = dir.path().join("moat.toml");
    std::fs::write(&config, front_toml(&[&nodes[0], &nodes[1]])).unwrap();
    let mut replicas: Vec<Replica> = REPLICAS
        .iter()
        .map(|name| {
            let claims = dir.path().join(format!("{name}-claims"));
            replica(
                dir.path(),
                &config,
                name,
                &["--claims", claims.to_str().unwrap()],
            )
        })
        .collect();
    let (_haproxy, lb) = haproxy(&replicas);
    let before = ts_agent(&lb);

    let agents = 300;
    let mut driver = Running(
        Command::new("python3")
            .arg(project().join("tests/clients/py_replicas.py"))
            .arg(format!("http://{lb}/mcp"))
            .arg(agents.to_string())
            .env("PYTHONPATH", python_path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3"),
    );
    let mut said = BufReader::new(driver.0.stdout.take().unwrap()).lines();
    let began = Instant::now();
    let line = said.next().expect("the driver's first line").unwrap();
    assert_eq!(line, "KILL", "the driver's first step failed");
    let victim = replicas.iter_mut().find(|r| r.name == "front-1").unwrap();
    victim.process.0.kill().unwrap();
    victim.process.0.wait().unwrap();
    let mut to_driver = driver.0.stdin.take().unwrap();
    writeln!(to_driver, "KILLED front-1").unwrap();
    let report = said
        .next()
        .expect("the driver's report")
        .unwrap_or_else(|e| panic!("reading the driver's report: {e}"));
    let elapsed = began.elapsed();
    let status = driver.0.wait().unwrap();
    assert!(status.success(), "the driver failed: {report}");
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    eprintln!("report: {report:#}");

    assert_eq!(report["wrong_replica"], serde_json::json!([]), "{report}");
    assert_eq!(
        report["second"]["unexpected"],
        serde_json::json!([]),
        "{report}"
    );
    // State was held on every replica, and what front-1 held failed, fast
    // and by name.
    for name in REPLICAS {
        assert!(
            report["holders"][name].as_u64().unwrap_or(0) > 0,
            "{name} held nothing: {report}"
        );
    }
    let failed = report["second"]["failed"].as_array().unwrap();
    assert_eq!(
        failed.len() as u64,
        report["holders"]["front-1"].as_u64().unwrap(),
        "{report}"
    );
    for failure in failed {
        let message = failure["message"].as_str().unwrap();
        assert!(message.contains("held by replica `front-1`"), "{failure}");
        assert!(failure["seconds"].as_f64().unwrap() < 5.0, "{failure}");
    }
    // The agents that came after: all on live replicas.
    let fresh: Vec<&str> = report["fresh"]["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap())
        .collect();
    assert_eq!(fresh, ["front-0", "front-2"], "{report}");
    for sdk in report["sdk_before"]
        .as_array()
        .unwrap()
        .iter()
        .chain(report["sdk_after"].as_array().unwrap())
    {
        assert!(
            sdk["ask"].as_str().unwrap().starts_with("o: hello Sdk"),
            "{sdk}"
        );
    }

    // The TypeScript SDK's session lands on a live replica too.
    let after = ts_agent(&lb);
    for (report, live) in [
        (&before, &REPLICAS[..]),
        (&after, &["front-0", "front-2"][..]),
    ] {
        let session = report["session"].as_str().unwrap();
        let holder = session.rsplit_once('.').unwrap().1;
        assert!(live.contains(&holder), "{report}");
    }

    let requests = report["requests"].as_u64().unwrap();
    eprintln!(
        "{agents} agents, {requests} requests in {elapsed:?} ({:.0} requests/s); latency {}",
        requests as f64 / elapsed.as_secs_f64(),
        report["latency_ms"]
    );

    // Every replica's audit log verifies, the killed one's too, and so
    // does every claim of a session that ended, with its replica's key
    // and against its replica's log.
    drop(_haproxy);
    for replica in replicas.iter_mut().filter(|r| r.name != "front-1") {
        // SAFETY: kill(2) on our own child's pid, which has not been reaped.
        let pid = libc::pid_t::try_from(replica.process.0.id()).unwrap();
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let status = replica.process.0.wait().unwrap();
        assert!(status.success(), "{} exited with {status}", replica.name);
    }
    let mut claims = 0;
    for replica in &replicas {
        let state = dir.path().join(format!("{}-state", replica.name));
        let key = ok(
            &moat(&["key", "show", "--public"], &state, &[]),
            "moat key show",
        );
        let written = dir.path().join(format!("{}-claims", replica.name));
        for claim in std::fs::read_dir(&written).unwrap() {
            let claim = claim.unwrap().path();
            ok(
                &moat(
                    &[
                        "claim",
                        "verify",
                        claim.to_str().unwrap(),
                        "--public-key",
                        key.trim(),
                        "--audit",
                        replica.audit.to_str().unwrap(),
                    ],
                    &state,
                    &[],
                ),
                &format!("{}: moat claim verify {}", replica.name, claim.display()),
            );
            claims += 1;
        }
    }
    eprintln!("{claims} claims verified");
    assert!(claims >= agents, "{claims} claims");
    for replica in &replicas {
        let verified = moat(
            &["audit", "verify", replica.audit.to_str().unwrap()],
            &dir.path().join(format!("{}-state", replica.name)),
            &[],
        );
        assert!(
            verified.status.success(),
            "{}: {}{}",
            replica.name,
            String::from_utf8_lossy(&verified.stdout),
            String::from_utf8_lossy(&verified.stderr)
        );
    }
}

/// The replicas read one config volume; a revocation written to it
/// reaches every replica through `--watch`, and a call to the revoked tool
/// is refused on each.
#[test]
fn a_revocation_written_to_the_shared_volume_refuses_the_tool_on_every_replica() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!("[servers.wasm]\nwasm = {:?}\n", guests::EVERYTHING_WASM);
    // The lock is made where the operator works, then published.
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("moat.toml"), &toml).unwrap();
    let state = dir.path().join("operator-state");
    let work_config = work.join("moat.toml");
    ok(
        &moat(
            &["lock", "--config", work_config.to_str().unwrap()],
            &state,
            &[],
        ),
        "moat lock",
    );
    let lock = std::fs::read(work.join("moat.lock")).unwrap();
    let config = volume(
        dir.path(),
        &[("moat.toml", toml.as_bytes()), ("moat.lock", &lock)],
    );
    let replicas: Vec<Replica> = REPLICAS
        .iter()
        .map(|name| replica(dir.path(), &config, name, &["--locked", "--watch"]))
        .collect();
    for replica in &replicas {
        let (status, answered, json) = stateless_call(&replica.address, "wasm__add");
        assert_eq!(status, 200, "{json}");
        assert_eq!(answered.as_deref(), Some(replica.name));
        assert_eq!(json["result"]["content"][0]["text"], "42", "{json}");
    }

    ok(
        &moat(
            &[
                "revoke",
                "--config",
                work_config.to_str().unwrap(),
                "--reason",
                "leaks its input",
                "wasm__add",
            ],
            &state,
            &[],
        ),
        "moat revoke",
    );
    let published = Instant::now();
    update_volume(
        config.parent().unwrap(),
        &[
            ("moat.toml", toml.clone().into_bytes()),
            ("moat.lock", std::fs::read(work.join("moat.lock")).unwrap()),
        ],
    );
    // The stated bound (README "Running more than one"): a replica applies
    // a change to its volume within a second of seeing it.
    let bound = Duration::from_secs(1);
    for replica in &replicas {
        let refused = loop {
            let (_, answered, json) = stateless_call(&replica.address, "wasm__add");
            assert_eq!(answered.as_deref(), Some(replica.name));
            let text = json.to_string();
            if text.contains("revoked") {
                break published.elapsed();
            }
            assert!(
                published.elapsed() < HANG,
                "{} never refused the revoked tool: {json}",
                replica.name
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        eprintln!(
            "{} refused the revoked tool {refused:?} after the volume changed",
            replica.name
        );
        assert!(refused < bound, "{}: {refused:?}", replica.name);
    }
}

/// SIGTERM, as Kubernetes stops a pod: the replica closes its listener
/// and turns new sessions away, so HAProxy sends new work to the others at
/// once, while the call in flight on it is answered in full and the
/// replica then exits cleanly.
#[test]
fn a_replica_told_to_stop_finishes_its_call_while_new_work_goes_to_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[serve]\ndrain_timeout_ms = 30000\n\n[servers.wasm]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    let mut replicas: Vec<Replica> = REPLICAS[..2]
        .iter()
        .map(|name| replica(dir.path(), &config, name, &[]))
        .collect();
    let (_haproxy, lb) = haproxy(&replicas);
    let mut driver = Running(
        Command::new("python3")
            .arg(project().join("tests/clients/py_drain.py"))
            .arg(format!("http://{lb}/mcp"))
            .env("PYTHONPATH", python_path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3"),
    );
    let mut said = BufReader::new(driver.0.stdout.take().unwrap()).lines();
    let line = said.next().expect("the driver's first line").unwrap();
    let holder = line
        .strip_prefix("HOLDER ")
        .unwrap_or_else(|| panic!("the driver said {line:?}"))
        .to_owned();
    let stopping = replicas.iter_mut().find(|r| r.name == holder).unwrap();
    let pid = libc::pid_t::try_from(stopping.process.0.id()).unwrap();
    // SAFETY: kill(2) on our own child's pid, which has not been reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    writeln!(driver.0.stdin.take().unwrap(), "TERMINATED").unwrap();
    let report = said.next().expect("the driver's report").unwrap();
    assert!(driver.0.wait().unwrap().success(), "{report}");
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    eprintln!("{report:#}");
    let other = REPLICAS[..2].iter().find(|r| **r != holder).unwrap();
    for answer in report["during_drain"].as_array().unwrap() {
        assert_eq!(answer, &serde_json::json!([200, other, true]), "{report}");
    }
    assert_eq!(report["call_replica"], holder.as_str(), "{report}");
    // Progress went on during the drain (the last notification may come
    // after the answer and go unread), and the answer is whole.
    assert!(report["progress"].as_u64().unwrap() >= 2, "{report}");
    assert_eq!(
        report["result"]["result"]["content"][0]["text"], "6 steps done",
        "{report}"
    );
    assert_eq!(report["result"]["result"]["isError"], false, "{report}");
    let status = stopping.process.0.wait().unwrap();
    assert!(status.success(), "{holder} exited with {status}");
}
