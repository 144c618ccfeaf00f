//! Off loopback a registry is reached over https only: plain http, a
//! redirect to plain http and a token realm on plain http are refused, and
//! an https registry redirecting to plain http is refused even to loopback.

use super::*;

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
