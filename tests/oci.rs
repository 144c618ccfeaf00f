//! Components from an OCI registry: a real one (the Distribution registry,
//! Debian's `docker-registry`, installed by tests/setup.sh) on loopback,
//! published to the way the ecosystem publishes (oci-wasm: one
//! `application/wasm` layer), and a hostile one that serves bytes other
//! than the ones its manifest names.

use std::io::{BufRead as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use moat_host::Digest;
use moat_test_guests as guests;

/// A Distribution registry on 127.0.0.1, storing into a temporary
/// directory; its log is kept to count what was fetched.
struct Registry {
    child: Child,
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Registry {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:0\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let mut child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("docker-registry, the Distribution registry (tests/setup.sh installs it)");
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|line| {
                let at = line.find("listening on ")?;
                let rest = &line[at + "listening on ".len()..];
                Some(rest.split(['"', ' ']).next()?.to_owned())
            })
            .expect("the registry says where it listens");
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        Self {
            child,
            addr,
            log,
            _dir: dir,
        }
    }

    /// How many GETs of this blob the registry has answered so far.
    fn blob_gets(&self, digest: Digest) -> usize {
        let needle = format!("/blobs/sha256:{digest}");
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|line| line.contains(&needle) && line.contains("GET"))
            .count()
    }

    /// Publishes `component` as `repo:tag` with oci-wasm, as wkg does;
    /// returns the manifest's digest.
    fn push(&self, repo_tag: &str, component: &Path) -> Digest {
        runtime().block_on(async {
            let client = oci_wasm::WasmClient::new(plain_client());
            let (config, layer) = oci_wasm::WasmConfig::from_component(component, None)
                .await
                .unwrap();
            let reference: oci_client::Reference =
                format!("{}/{repo_tag}", self.addr).parse().unwrap();
            let pushed = client
                .push(
                    &reference,
                    &oci_client::secrets::RegistryAuth::Anonymous,
                    layer,
                    config,
                    None,
                )
                .await
                .unwrap();
            let digest = pushed.manifest_url.rsplit("sha256:").next().unwrap();
            digest.parse().unwrap()
        })
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn plain_client() -> oci_client::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::Http,
        ..Default::default()
    })
}

/// A directory with a `moat.toml` (and its lock), a data directory for the
/// store, and `moat` run against them.
struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("moat.toml")
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("data/store/oci")
    }

    fn write(&self, server: &str) {
        std::fs::write(self.config(), format!("[servers.tool]\n{server}\n")).unwrap();
    }

    fn moat(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("running moat")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_moat"));
        command
            .args(args)
            .arg("--config")
            .arg(self.config())
            .env("MOAT_DATA_DIR", self.dir.path().join("data"))
            .env(
                "MOAT_CACHE_DIR",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
            )
            .env_remove("RUST_LOG");
        command
    }

    /// Runs `moat args`, which must fail: its stderr and its peak resident
    /// memory in KiB. The kernel counts into a child's peak (`ru_maxrss`)
    /// the peak of the process it was forked from, up to its exec; this
    /// test process is large, so moat is started by a fresh, small copy of
    /// this test binary running only [`measure_helper`], which waits for it
    /// with `wait4` and prints the peak.
    fn fails_measured(&self, args: &[&str]) -> (String, u64) {
        let moat = self.command(args);
        let output = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "measure_helper",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                MEASURE,
                moat.get_args()
                    .map(|a| a.to_str().unwrap())
                    .collect::<Vec<_>>()
                    .join("\x1f"),
            )
            .envs(moat.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .env_remove("RUST_LOG")
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let peak = stdout
            .lines()
            .find_map(|line| line.strip_prefix("peak-kib "))
            .unwrap_or_else(|| panic!("the helper did not report: {stdout}"));
        let stderr = stdout
            .split_once("stderr-begin\n")
            .and_then(|(_, rest)| rest.split_once("stderr-end\n"))
            .map(|(stderr, _)| stderr.to_owned())
            .unwrap();
        (stderr, peak.parse().unwrap())
    }

    /// The files in the store's blob directory (none when it is absent).
    fn blobs(&self) -> Vec<String> {
        match std::fs::read_dir(self.store().join("blobs/sha256")) {
            Ok(entries) => entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("{e}"),
        }
    }

    /// Runs `moat args`, which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let output = self.moat(args);
        assert!(
            output.status.success(),
            "moat {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs `moat args`, which must fail; its stderr.
    fn fails(&self, args: &[&str]) -> String {
        let output = self.moat(args);
        assert!(
            !output.status.success(),
            "moat {args:?} succeeded: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    }
}

/// The environment variable that makes [`measure_helper`] run moat.
const MEASURE: &str = "MOAT_OCI_TEST_MEASURE";

/// Not a test of its own: in the copy of this binary that
/// [`Workspace::fails_measured`] starts, runs moat with the arguments in
/// `MOAT_OCI_TEST_MEASURE` (separated by U+001F), which must fail, and
/// prints its stderr and peak resident memory; without the variable, it
/// does nothing.
#[test]
#[expect(
    clippy::zombie_processes,
    reason = "the child is reaped by wait4, which std's Child cannot call"
)]
fn measure_helper() {
    let Ok(args) = std::env::var(MEASURE) else {
        return;
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(args.split('\x1f'))
        .env_remove(MEASURE)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running moat");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let pid = i32::try_from(child.id()).unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is this process's child, not reaped yet (std's Child
    // never waited on it); `status` and `usage` are valid for writes.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid, "{}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) != 0,
        "moat {args:?} did not fail (wait status {status}): {stderr}"
    );
    println!("\npeak-kib {}", usage.ru_maxrss);
    print!("stderr-begin\n{stderr}stderr-end\n");
}

fn digest_of(path: &str) -> Digest {
    Digest::of(&std::fs::read(path).unwrap())
}

#[test]
fn a_digest_reference_is_pulled_once_pinned_by_its_manifest_and_locked() {
    let mut registry = Registry::start();
    let manifest = registry.push("moat/everything:v1", Path::new(guests::EVERYTHING_WASM));
    let layer = digest_of(guests::EVERYTHING_WASM);
    let reference = format!(
        "oci://{}/moat/everything:v1@sha256:{manifest}",
        registry.addr
    );
    let work = Workspace::new();
    // A digest pins the component through its manifest: no `sha256` and no
    // `allow_unmeasured` needed.
    work.write(&format!("wasm = \"{reference}\""));

    let pulled = work.ok(&["pull"]);
    assert!(pulled.starts_with(&format!("{reference}\n")), "{pulled}");
    assert!(
        pulled.contains(&format!("component sha256:{layer} (")),
        "{pulled}"
    );
    assert!(pulled.contains("pulled to"), "{pulled}");
    let stored = work.store().join(format!("blobs/sha256/{layer}"));
    assert_eq!(
        std::fs::read(&stored).unwrap(),
        std::fs::read(guests::EVERYTHING_WASM).unwrap()
    );
    assert_eq!(registry.blob_gets(layer), 1);

    let tools = work.ok(&["tools", "tool"]);
    assert!(tools.contains("echo"), "{tools}");
    assert!(
        tools.contains(&format!(
            "oci       {reference} (manifest sha256:{manifest})"
        )),
        "{tools}"
    );
    work.ok(&["lock"]);
    let lock: toml::Value =
        toml::from_str(&std::fs::read_to_string(work.dir.path().join("moat.lock")).unwrap())
            .unwrap();
    let server = &lock["servers"]["tool"];
    assert_eq!(server["sha256"].as_str(), Some(layer.to_string().as_str()));
    assert_eq!(
        server["oci"]["reference"].as_str(),
        Some(reference.as_str())
    );
    assert_eq!(
        server["oci"]["manifest"].as_str(),
        Some(manifest.to_string().as_str())
    );
    assert_eq!(
        server["oci"]["layer"].as_str(),
        Some(layer.to_string().as_str())
    );
    assert_eq!(registry.blob_gets(layer), 1, "launches use the store");

    // With the registry gone, everything still runs from the store.
    registry.stop();
    let again = work.ok(&["pull"]);
    assert!(again.contains("already in"), "{again}");
    let tools = work.ok(&["tools", "--locked", "tool"]);
    assert!(tools.contains("echo"), "{tools}");
}

#[test]
fn a_tag_alone_needs_consent_and_under_the_lock_a_moved_tag_changes_nothing() {
    let registry = Registry::start();
    let first = registry.push("moat/tool:latest", Path::new(guests::EVERYTHING_WASM));
    let reference = format!("oci://{}/moat/tool:latest", registry.addr);
    let work = Workspace::new();
    work.write(&format!("wasm = \"{reference}\""));
    let refused = work.fails(&["tools", "tool"]);
    assert!(
        refused.contains("server `tool` has no sha256 pinned: refusing an unmeasured launch"),
        "{refused}"
    );
    assert!(
        !work.store().exists(),
        "nothing is pulled for a refused launch"
    );

    work.write(&format!("wasm = \"{reference}\"\nallow_unmeasured = true"));
    work.ok(&["lock"]);
    let lock = std::fs::read_to_string(work.dir.path().join("moat.lock")).unwrap();
    assert!(lock.contains(&format!("manifest = \"{first}\"")), "{lock}");

    // The tag moves to another component.
    let second = registry.push("moat/tool:latest", Path::new(guests::FUZZABLE_WASM));
    assert_ne!(first, second);
    let locked = work.ok(&["tools", "--locked", "tool"]);
    assert!(
        locked.contains("echo"),
        "the locked manifest runs: {locked}"
    );
    assert!(!locked.contains("countdown"), "{locked}");
    let moved = work.ok(&["pull"]);
    assert!(moved.contains(&format!("@sha256:{second}")), "{moved}");
    assert_eq!(registry.blob_gets(digest_of(guests::FUZZABLE_WASM)), 1);
    work.ok(&["pull"]);
    assert_eq!(
        registry.blob_gets(digest_of(guests::FUZZABLE_WASM)),
        1,
        "a tag is looked up again, its component is not downloaded again"
    );

    // Naming the new manifest conflicts with the lock until `moat lock`.
    work.write(&format!("wasm = \"{reference}@sha256:{second}\""));
    let conflict = work.fails(&["tools", "--locked", "tool"]);
    assert!(
        conflict.contains(&format!(
            "server `tool`: the config names {reference}@sha256:{second} but the lock approved {reference} (manifest sha256:{first})"
        )),
        "{conflict}"
    );
    work.ok(&["lock"]);
    let unlocked = work.ok(&["tools", "--locked", "tool"]);
    assert!(unlocked.contains("countdown"), "{unlocked}");
}

#[test]
fn a_pin_other_than_the_manifests_layer_and_a_missing_manifest_are_refused() {
    let registry = Registry::start();
    let manifest = registry.push("moat/everything:v1", Path::new(guests::EVERYTHING_WASM));
    let layer = digest_of(guests::EVERYTHING_WASM);
    let other = digest_of(guests::FUZZABLE_WASM);
    let reference = format!("oci://{}/moat/everything@sha256:{manifest}", registry.addr);
    let work = Workspace::new();
    work.write(&format!("wasm = \"{reference}\"\nsha256 = \"{other}\""));
    let refused = work.fails(&["tools", "tool"]);
    assert!(
        refused.contains(&format!(
            "server `tool`: {reference} names the component sha256:{layer}, but sha256:{other} is pinned: refused"
        )),
        "{refused}"
    );

    let unknown = format!("oci://{}/moat/everything@sha256:{other}", registry.addr);
    work.write(&format!("wasm = \"{unknown}\""));
    let missing = work.fails(&["tools", "tool"]);
    assert!(
        missing.contains(&format!("pulling {unknown}: manifest: ")),
        "{missing}"
    );
}

#[test]
fn an_artifact_that_is_not_one_wasm_layer_is_refused_by_name() {
    let registry = Registry::start();
    let reference: oci_client::Reference =
        format!("{}/moat/image:v1", registry.addr).parse().unwrap();
    runtime().block_on(async {
        let layer = oci_client::client::ImageLayer::new(
            b"not a component".to_vec(),
            "application/vnd.oci.image.layer.v1.tar".into(),
            None,
        );
        let config = oci_client::client::Config::new(
            b"{}".to_vec(),
            "application/vnd.oci.image.config.v1+json".into(),
            None,
        );
        plain_client()
            .push(
                &reference,
                &[layer],
                config,
                &oci_client::secrets::RegistryAuth::Anonymous,
                None,
            )
            .await
            .unwrap();
    });
    let work = Workspace::new();
    work.write("wasm = \"oci://127.0.0.1:1/x:1\"");
    let shown = format!("oci://{}/moat/image:v1", registry.addr);
    let refused = work.fails(&["pull", &shown]);
    assert!(
        refused.contains(&format!(
            "pulling {shown}: not a wasm component artifact: its layer has media type application/vnd.oci.image.layer.v1.tar, not application/wasm"
        )),
        "{refused}"
    );
}

/// A registry that serves an honest manifest and then, for its layer, the
/// component with one byte changed (same length).
fn hostile_registry(manifest: Vec<u8>, blob: Vec<u8>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match stream.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let head = String::from_utf8_lossy(&head);
            let path = head.split(' ').nth(1).unwrap_or("");
            let (kind, body): (&str, &[u8]) = if path.contains("/manifests/") {
                ("application/vnd.oci.image.manifest.v1+json", &manifest)
            } else if path.contains("/blobs/") {
                ("application/octet-stream", &blob)
            } else {
                ("application/json", b"{}")
            };
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(body);
        }
    });
    addr
}

#[test]
fn a_registry_serving_other_bytes_than_its_manifest_names_is_refused() {
    let component = std::fs::read(guests::EVERYTHING_WASM).unwrap();
    let layer = Digest::of(&component);
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.wasm.config.v0+json","digest":"sha256:{layer}","size":2}},"layers":[{{"mediaType":"application/wasm","digest":"sha256:{layer}","size":{}}}]}}"#,
        component.len()
    )
    .into_bytes();
    let mut tampered = component.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    let addr = hostile_registry(manifest.clone(), tampered);
    let work = Workspace::new();

    let honest = Digest::of(&manifest);
    let reference = format!("oci://{addr}/moat/everything@sha256:{honest}");
    work.write(&format!("wasm = \"{reference}\""));
    let refused = work.fails(&["tools", "tool"]);
    assert!(
        refused.contains(&format!(
            "pulling {reference}: the layer's bytes are {} bytes hashing to sha256:",
            component.len()
        )),
        "{refused}"
    );
    assert!(
        refused.contains(&format!(
            ", not the layer sha256:{layer} the manifest names: refused"
        )),
        "{refused}"
    );
    assert!(
        !work.store().join(format!("blobs/sha256/{layer}")).exists(),
        "no component is stored"
    );

    // The reference names another manifest than the one served.
    let wrong = format!("oci://{addr}/moat/everything@sha256:{layer}");
    work.write(&format!("wasm = \"{wrong}\""));
    let refused = work.fails(&["tools", "tool"]);
    assert!(
        refused.contains(&format!(
            "pulling {wrong}: the registry's manifest hashes to sha256:{honest}, not the digest the reference names (sha256:{layer}): refused"
        )),
        "{refused}"
    );
    assert!(
        !work.store().join(format!("blobs/sha256/{layer}")).exists(),
        "{refused}"
    );
}

/// This machine's address on its outbound interface (not loopback): a UDP
/// socket "connected" to a TEST-NET address sends nothing, and its local
/// address is the interface's.
fn non_loopback_address() -> std::net::IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket
        .connect("198.51.100.1:9")
        .expect("a route off loopback (this test needs a non-loopback interface)");
    let ip = socket.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "{ip}");
    ip
}

#[test]
fn a_registry_off_loopback_is_reached_over_https_only() {
    let ip = non_loopback_address();
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (first_bytes, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut byte = [0u8; 1];
            let _ = stream.read_exact(&mut byte);
            let _ = first_bytes.send(byte[0]);
            // Not TLS: the handshake fails.
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let work = Workspace::new();
    let reference = format!("oci://{ip}:{port}/moat/everything:v1");
    let refused = work.fails(&["pull", &reference]);
    assert!(
        refused.contains(&format!("pulling {reference}: manifest: ")),
        "{refused}"
    );
    let first: Vec<u8> = seen.try_iter().collect();
    assert!(!first.is_empty(), "the registry was never reached");
    assert!(
        first.iter().all(|b| *b == 0x16),
        "every connection opened with a TLS handshake record, never plain HTTP: {first:?}"
    );
    assert!(!work.store().exists());
}

/// A registry on 127.0.0.1 that answers every request by `answer(path,
/// stream)`, each connection on its own thread; its address.
fn scripted_registry(
    answer: impl Fn(&str, &mut std::net::TcpStream) + Send + Sync + 'static,
) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split(' ').nth(1).unwrap_or("").to_owned();
                answer(&path, &mut stream);
            });
        }
    });
    addr
}

/// Answers 200 with `body`.
fn answer_with(stream: &mut std::net::TcpStream, kind: &str, body: &[u8]) {
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(body);
}

/// What an endless answer sends at most: far above every cap, so a client
/// that reads it whole holds at least this much.
const ENDLESS: u64 = 128 << 20;

/// The peak resident memory a refused pull may reach, in KiB: the caps
/// (4 MiB at most) and the process itself (about 35 MiB), half of
/// [`ENDLESS`].
const PEAK_KIB: u64 = 64 << 10;

/// What an endless answer may have sent when moat stopped reading at a
/// cap of at most 4 MiB: that, plus what loopback's socket buffers hold.
const CUT_OFF: u64 = 32 << 20;

/// Answers 200 with a chunked body of spaces that goes on (up to
/// [`ENDLESS`] bytes, or until the client hangs up), counting into `sent`.
fn answer_endless(stream: &mut std::net::TcpStream, kind: &str, sent: &AtomicU64) {
    if write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return;
    }
    let chunk = vec![b' '; 64 << 10];
    while sent.load(Ordering::SeqCst) < ENDLESS {
        let framed = write!(stream, "{:x}\r\n", chunk.len())
            .and_then(|()| stream.write_all(&chunk))
            .and_then(|()| stream.write_all(b"\r\n"));
        if framed.is_err() {
            return;
        }
        sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
    }
    let _ = stream.write_all(b"0\r\n\r\n");
}

/// A listener on this machine's non-loopback address that records every
/// connection made to it; `connections()` is read after the pull ended.
struct Elsewhere {
    listener: std::net::TcpListener,
    addr: std::net::SocketAddr,
}

impl Elsewhere {
    fn new() -> Self {
        let listener = std::net::TcpListener::bind((non_loopback_address(), 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        Self { listener, addr }
    }

    /// Connections made so far (the kernel completes them in the backlog
    /// before anyone accepts, so this sees every one made by a process that
    /// has exited).
    fn connections(&self) -> usize {
        std::iter::from_fn(|| self.listener.accept().ok()).count()
    }
}

fn component_manifest(layer: Digest, size: usize) -> Vec<u8> {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.wasm.config.v0+json","digest":"sha256:{layer}","size":2}},"layers":[{{"mediaType":"application/wasm","digest":"sha256:{layer}","size":{size}}}]}}"#
    )
    .into_bytes()
}

#[test]
fn an_endless_manifest_is_refused_at_its_cap_in_bounded_memory() {
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let addr = scripted_registry(move |path, stream| {
        if path.contains("/manifests/") {
            answer_endless(
                stream,
                "application/vnd.oci.image.manifest.v1+json",
                &counted,
            );
        } else {
            answer_with(stream, "application/json", b"{}");
        }
    });
    let work = Workspace::new();
    let reference = format!("oci://{addr}/moat/endless:v1");
    let (refused, peak) = work.fails_measured(&["pull", &reference]);
    assert!(
        refused.contains(&format!(
            "pulling {reference}: manifest: the answer from http://{addr}/v2/moat/endless/manifests/v1 runs past {} bytes (the manifest limit): refused",
            moat_host::oci::MAX_MANIFEST_BYTES
        )),
        "{refused}"
    );
    assert!(
        peak < PEAK_KIB,
        "moat's peak resident memory was {peak} KiB, above {PEAK_KIB} KiB"
    );
    let sent = sent.load(Ordering::SeqCst);
    assert!(sent < CUT_OFF, "moat read on: {sent} bytes were sent");
    assert_eq!(work.blobs(), Vec::<String>::new(), "nothing is stored");
}

#[test]
fn an_endless_token_answer_is_refused_at_its_cap_in_bounded_memory() {
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let addr = Arc::new(Mutex::new(String::new()));
    let realm = addr.clone();
    let registry = scripted_registry(move |path, stream| {
        if path.starts_with("/token") {
            answer_endless(stream, "application/json", &counted);
        } else {
            let _ = write!(
                stream,
                "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"http://{}/token\",service=\"moat-test\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                realm.lock().unwrap()
            );
        }
    });
    *addr.lock().unwrap() = registry.clone();
    let work = Workspace::new();
    let reference = format!("oci://{registry}/moat/endless:v1");
    let (refused, peak) = work.fails_measured(&["pull", &reference]);
    assert!(
        refused.contains(&format!(
            "pulling {reference}: token: the answer from http://{registry}/token?scope=repository%3Amoat%2Fendless%3Apull&service=moat-test runs past {} bytes (the token answer limit): refused",
            moat_host::oci::MAX_TOKEN_BYTES
        )),
        "{refused}"
    );
    assert!(
        peak < PEAK_KIB,
        "moat's peak resident memory was {peak} KiB, above {PEAK_KIB} KiB"
    );
    let sent = sent.load(Ordering::SeqCst);
    assert!(sent < CUT_OFF, "moat read on: {sent} bytes were sent");
    assert_eq!(work.blobs(), Vec::<String>::new(), "nothing is stored");
}

#[test]
fn a_blob_longer_than_its_manifest_declares_is_refused_at_the_declared_size() {
    let component = std::fs::read(guests::EVERYTHING_WASM).unwrap();
    let layer = Digest::of(&component);
    let manifest = component_manifest(layer, component.len());
    let honest = Digest::of(&manifest);
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let addr = scripted_registry(move |path, stream| {
        if path.contains("/manifests/") {
            answer_with(
                stream,
                "application/vnd.oci.image.manifest.v1+json",
                &manifest,
            );
        } else if path.contains("/blobs/") {
            // The component's bytes would do; an endless answer shows
            // that nothing past the declared size is read.
            answer_endless(stream, "application/octet-stream", &counted);
        } else {
            answer_with(stream, "application/json", b"{}");
        }
    });
    let work = Workspace::new();
    let reference = format!("oci://{addr}/moat/everything@sha256:{honest}");
    let (refused, peak) = work.fails_measured(&["pull", &reference]);
    assert!(
        refused.contains(&format!(
            "pulling {reference}: component: the answer from http://{addr}/v2/moat/everything/blobs/sha256:{layer} runs past {} bytes (the size the manifest declares): refused",
            component.len()
        )),
        "{refused}"
    );
    assert!(
        peak < PEAK_KIB,
        "moat's peak resident memory was {peak} KiB, above {PEAK_KIB} KiB"
    );
    let sent = sent.load(Ordering::SeqCst);
    assert!(sent < CUT_OFF, "moat read on: {sent} bytes were sent");
    assert_eq!(
        work.blobs(),
        vec![honest.to_string()],
        "the verified manifest is kept; no component, no temporary file"
    );
}

#[test]
fn a_redirect_to_plain_http_off_loopback_is_refused_before_it_is_followed() {
    let elsewhere = Elsewhere::new();
    let target = elsewhere.addr;
    let component = std::fs::read(guests::EVERYTHING_WASM).unwrap();
    let layer = Digest::of(&component);
    let manifest = component_manifest(layer, component.len());
    let honest = Digest::of(&manifest);
    let addr = scripted_registry(move |path, stream| {
        let redirect = |stream: &mut std::net::TcpStream| {
            let _ = write!(
                stream,
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://{target}{path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        };
        if path.contains("/manifests/v1") || path.contains("/blobs/") {
            redirect(stream);
        } else if path.contains("/manifests/") {
            answer_with(
                stream,
                "application/vnd.oci.image.manifest.v1+json",
                &manifest,
            );
        } else {
            answer_with(stream, "application/json", b"{}");
        }
    });
    let work = Workspace::new();

    // The manifest, sent elsewhere over plain http.
    let reference = format!("oci://{addr}/moat/everything:v1");
    let refused = work.fails(&["pull", &reference]);
    let from = format!("http://{addr}/v2/moat/everything/manifests/v1");
    let to = format!("http://{target}/v2/moat/everything/manifests/v1");
    assert!(
        refused.contains(&format!(
            "pulling {reference}: manifest: refused the redirect from {from} to {to}: plain http is used on loopback only"
        )),
        "{refused}"
    );
    assert_eq!(elsewhere.connections(), 0, "nothing reached {target}");

    // The component, sent elsewhere over plain http (as a CDN would be, on https).
    let reference = format!("oci://{addr}/moat/everything@sha256:{honest}");
    let refused = work.fails(&["pull", &reference]);
    let from = format!("http://{addr}/v2/moat/everything/blobs/sha256:{layer}");
    let to = format!("http://{target}/v2/moat/everything/blobs/sha256:{layer}");
    assert!(
        refused.contains(&format!(
            "pulling {reference}: component: refused the redirect from {from} to {to}: plain http is used on loopback only"
        )),
        "{refused}"
    );
    assert_eq!(elsewhere.connections(), 0, "nothing reached {target}");
    assert!(!work.store().join(format!("blobs/sha256/{layer}")).exists());
}

#[test]
fn a_token_realm_on_plain_http_off_loopback_is_refused_by_name() {
    let elsewhere = Elsewhere::new();
    let target = elsewhere.addr;
    let addr = scripted_registry(move |_, stream| {
        let _ = write!(
            stream,
            "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"http://{target}/token\",service=\"moat-test\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    });
    let work = Workspace::new();
    let reference = format!("oci://{addr}/moat/everything:v1");
    let refused = work.fails(&["pull", &reference]);
    assert!(
        refused.contains(&format!(
            "pulling {reference}: manifest: refused the token realm http://{target}/token: a token realm must be https (plain http only on the host of a registry on loopback)"
        )),
        "{refused}"
    );
    assert_eq!(elsewhere.connections(), 0, "nothing reached {target}");
    assert_eq!(work.blobs(), Vec::<String>::new());
}

/// Runs `openssl args` in `dir`, which must succeed.
fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command (to make a test certificate)");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// An https registry on this machine's non-loopback address, its
/// certificate issued by a test CA written to `ca.pem` in `dir` (which moat
/// is told to trust by `SSL_CERT_FILE`); every request is answered by
/// `answer(path, stream)`. Its `host:port`.
fn https_registry(
    dir: &Path,
    answer: impl Fn(&str, &mut dyn std::io::Write) + Send + Sync + 'static,
) -> String {
    use rustls::pki_types::pem::PemObject as _;
    let ip = non_loopback_address();
    std::fs::write(
        dir.join("leaf.ext"),
        format!("subjectAltName=IP:{ip}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"),
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=moat test CA",
            ],
        ]
        .concat(),
    );
    openssl(
        dir,
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "leaf.key",
                "-out",
                "leaf.csr",
                "-subj",
                "/CN=moat test registry",
            ],
        ]
        .concat(),
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "leaf.ext",
            "-out",
            "leaf.pem",
        ],
    );
    let chain =
        vec![rustls::pki_types::CertificateDer::from_pem_file(dir.join("leaf.pem")).unwrap()];
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(dir.join("leaf.key")).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap(),
    );
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let (config, answer) = (config.clone(), answer.clone());
            std::thread::spawn(move || {
                let Ok(connection) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(connection, stream);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match tls.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split(' ').nth(1).unwrap_or("").to_owned();
                answer(&path, &mut tls);
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    addr
}

#[test]
fn an_https_registry_redirecting_to_plain_http_is_refused_even_to_loopback() {
    let dir = tempfile::tempdir().unwrap();
    // The target: plain http on loopback, which a registry on loopback
    // could use, but a pull that is on https never does.
    let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    target.set_nonblocking(true).unwrap();
    let to_addr = target.local_addr().unwrap();
    let addr = https_registry(dir.path(), move |path, stream| {
        let _ = if path.contains("/manifests/") {
            write!(
                stream,
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://{to_addr}{path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
        } else {
            write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            )
        };
    });
    let work = Workspace::new();
    let reference = format!("oci://{addr}/moat/everything:v1");
    let output = work
        .command(&["pull", &reference])
        .env("SSL_CERT_FILE", dir.path().join("ca.pem"))
        .env_remove("SSL_CERT_DIR")
        .output()
        .unwrap();
    let refused = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{refused}");
    assert!(
        refused.contains(&format!(
            "pulling {reference}: manifest: refused the redirect from https://{addr}/v2/moat/everything/manifests/v1 to http://{to_addr}/v2/moat/everything/manifests/v1: a pull that is on https never goes to plain http"
        )),
        "{refused}"
    );
    assert_eq!(
        std::iter::from_fn(|| target.accept().ok()).count(),
        0,
        "nothing reached {to_addr}"
    );
    assert!(!work.store().exists());
}
