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

mod caps;
mod pinning;
mod plain_http;

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
