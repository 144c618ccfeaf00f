//! Native egress under load and across clients: connections bounded per
//! server, session and gateway, and the proxy transparent to every client
//! (Node, Python, Go, curl, PostgreSQL).

use super::*;

/// A host service for many connections at once: each gets `pong` for each
/// line it sends and is held until its client closes it.
fn pong_many() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(b"pong").is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// Issue 32, item 2: native servers flooding Moat's egress proxy with
/// connections they hold spend Moat's descriptors (two each). Each server's
/// connections are bounded (`egress_connections_per_server`), each agent
/// session's (`..._per_session`) and the gateway's (`egress_connections`):
/// two flooding servers get the limit beyond their bound, a third server
/// still connects, and a connection beyond the session's or the gateway's
/// bound is refused naming it. The first session's flooder is the instance
/// the name check started: taken over, it counts against that session.
#[tokio::test]
async fn egress_connections_are_bounded_per_server_session_and_gateway() {
    use moat_host::config::{Config, ServeSettings};
    use moat_host::gateway::Gateway;
    use std::num::NonZeroUsize;
    let port = pong_many();
    let addr = format!("127.0.0.1:{port}");
    let server = |name: &str| {
        let mut spec = spec(Launcher::Native, guests::PROBE);
        spec.name = name.into();
        // Three processes: the gateway runs identical servers as one.
        spec.env.values.insert("PROBE".into(), name.into());
        spec.net = vec![NetGrant {
            host: "127.0.0.1".into(),
            port,
        }];
        (name.to_owned(), spec)
    };
    let config = Config {
        path: "moat.toml".into(),
        servers: [server("flood_a"), server("flood_b"), server("third")].into(),
        serve: ServeSettings {
            egress_connections: NonZeroUsize::new(13).unwrap(),
            egress_connections_per_session: NonZeroUsize::new(10).unwrap(),
            egress_connections_per_server: NonZeroUsize::new(4).unwrap(),
            ..Default::default()
        },
        wasm: Default::default(),
        nodes: Default::default(),
    };
    let gateway = Gateway::new(Host::new(Some(cache())).unwrap(), config, None);
    gateway.check_names().await;
    let hold = |session: &moat_host::gateway::AgentSession, server: &str, count: u64| {
        let session = session.clone();
        let tool = format!("{server}__attack");
        let arguments = args(json!({"op": "hold", "addr": addr, "count": count}));
        async move {
            let result = session.call(&tool, arguments).await.unwrap();
            let report: serde_json::Value = serde_json::from_str(&text(&result)).unwrap();
            match report["ok"].as_bool() {
                Some(true) => Ok(report["data"].as_str().unwrap().to_owned()),
                _ => Err(report["error"].as_str().unwrap().to_owned()),
            }
        }
    };
    let refused = |held: usize, limit: &str| {
        Err(format!(
            "held {held}, then: HTTP/1.1 503 Service Unavailable moat: egress connection limit ({limit}) reached"
        ))
    };
    let first = gateway.session();
    assert_eq!(hold(&first, "flood_a", 6).await, refused(4, "4 per server"));
    assert_eq!(hold(&first, "flood_b", 6).await, refused(4, "4 per server"));
    // The flooders hold 8: a third server of the same session connects.
    assert_eq!(hold(&first, "third", 1).await, Ok("held 1".to_owned()));
    assert_eq!(hold(&first, "third", 2).await, refused(1, "10 per session"));
    // Another session's servers have a share of their own, up to the
    // gateway's bound.
    let second = gateway.session();
    assert_eq!(
        hold(&second, "flood_a", 6).await,
        refused(3, "13 per gateway")
    );
    // Moat survives and still serves: the flooders' connections go with
    // their sessions.
    for session in [first, second] {
        assert!(session.close().await.is_empty());
    }
    assert!(gateway.close_all().await.is_empty());
}

/// A loopback service at `address`: answers every HTTP request with `body`.
fn http_service(address: &str, body: &'static str) -> u16 {
    let listener = TcpListener::bind(address).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

/// A loopback service that speaks just enough of PostgreSQL's protocol to
/// turn every client away with `FATAL: granted postgres reached` (no
/// server to install: the client's own message proves where it got).
fn postgres_service() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                loop {
                    let mut length = [0u8; 4];
                    if stream.read_exact(&mut length).is_err() {
                        return;
                    }
                    let length = u32::from_be_bytes(length) as usize;
                    let mut rest = vec![0u8; length.saturating_sub(4).min(1 << 16)];
                    if stream.read_exact(&mut rest).is_err() {
                        return;
                    }
                    let code = rest
                        .get(..4)
                        .map(|c| u32::from_be_bytes(c.try_into().unwrap()));
                    // SSLRequest and GSSENCRequest: "not here", then the
                    // startup message follows.
                    if matches!(code, Some(80_877_103 | 80_877_104)) {
                        let _ = stream.write_all(b"N");
                        continue;
                    }
                    let mut fields = Vec::new();
                    for (kind, value) in [
                        (b'S', "FATAL"),
                        (b'V', "FATAL"),
                        (b'C', "28000"),
                        (b'M', "granted postgres reached"),
                    ] {
                        fields.push(kind);
                        fields.extend_from_slice(value.as_bytes());
                        fields.push(0);
                    }
                    fields.push(0);
                    let mut message = vec![b'E'];
                    message.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
                    message.extend_from_slice(&fields);
                    let _ = stream.write_all(&message);
                    return;
                }
            });
        }
    });
    port
}

/// A Go program that GETs its argument with net/http and prints the body.
fn go_client() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("egress-go");
    let binary = dir.join("goget");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("goget.go");
    std::fs::write(
        &source,
        "package main\n\nimport (\n\t\"fmt\"\n\t\"io\"\n\t\"net/http\"\n\t\"os\"\n)\n\nfunc main() {\n\tresponse, err := http.Get(os.Args[1])\n\tif err != nil {\n\t\tfmt.Fprintln(os.Stderr, err)\n\t\tos.Exit(1)\n\t}\n\tbody, _ := io.ReadAll(response.Body)\n\tfmt.Print(string(body))\n}\n",
    )
    .unwrap();
    let built = std::process::Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(&source)
        .env("GOCACHE", dir.join("cache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GO111MODULE", "off")
        .env("CGO_ENABLED", "0")
        .output()
        .expect("go (run `bash tests/setup.sh`, which installs it)");
    assert!(
        built.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    binary
}

/// Issue 33 item 5: egress works for any client. Inside the server's
/// namespace a `net` grant is reached directly, as anywhere: Node's
/// `fetch` (which ignores HTTP_PROXY), Python's requests and httpx, Go's
/// net/http, curl (direct and through the proxy) and a PostgreSQL client
/// each reach the granted loopback service and are refused an ungranted
/// one at once; an ungranted name is NXDOMAIN, and told to the observer.
/// A name is looked up once, at launch: re-pointed afterwards (to another
/// granted address), it still reaches the launch-time address only.
#[tokio::test]
async fn native_egress_is_transparent_to_every_client() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let py_egress = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/py-egress");
    let py_egress = std::fs::canonicalize(&py_egress)
        .unwrap_or_else(|_| panic!("{}: run `bash tests/setup.sh`", py_egress.display()));
    let go = go_client();
    let granted = http_service("127.0.0.1:0", "granted service A");
    // Service B: the same port on another loopback address.
    let other = TcpListener::bind(("127.0.0.2", granted));
    let repointed = match other {
        Ok(listener) => {
            drop(listener);
            http_service(
                &format!("127.0.0.2:{granted}"),
                "service B, where the name points later",
            )
        }
        Err(error) => panic!("binding 127.0.0.2:{granted}: {error}"),
    };
    assert_eq!(repointed, granted);
    let ungranted = http_service("127.0.0.1:0", "ungranted service");
    let postgres = postgres_service();

    let mut spec = spec(Launcher::Native, guests::PROBE);
    spec.net = [
        ("127.0.0.1", granted),
        ("127.0.0.2", granted),
        ("127.0.0.1", postgres),
        ("svc.test", granted),
        // An address outside 127/8: made an alias of the namespace's lo.
        ("10.255.255.1", granted),
    ]
    .into_iter()
    .map(|(host, port)| NetGrant {
        host: host.into(),
        port,
    })
    .collect();
    spec.dirs = vec![
        DirGrant {
            host: py_egress.clone(),
            guest: py_egress.display().to_string(),
            mode: DirMode::Ro,
            inode: None,
        },
        DirGrant {
            host: go.parent().unwrap().to_path_buf(),
            guest: go.parent().unwrap().display().to_string(),
            mode: DirMode::Ro,
            inode: None,
        },
    ];
    spec.env
        .values
        .insert("PYTHONPATH".into(), py_egress.display().to_string());
    let launched = Arc::new(AtomicBool::new(false));
    let flag = launched.clone();
    let refusals = Arc::new(Mutex::new(Vec::new()));
    let seen = refusals.clone();
    let host = common::host().with_egress(
        moat_host::egress::Shares::default()
            .with_lookup(moat_host::egress::Lookup::new(move |name: String| {
                // At launch svc.test is 127.0.0.1; asked again, 127.0.0.2.
                let later = flag.swap(true, Ordering::SeqCst);
                async move {
                    assert_eq!(name, "svc.test");
                    Ok(vec![
                        if later { "127.0.0.2" } else { "127.0.0.1" }
                            .parse()
                            .unwrap(),
                    ])
                }
            }))
            .observe(moat_host::egress::Observer::new(move |refusal| {
                seen.lock().unwrap().push(refusal)
            })),
    );
    let session = host.connect(&spec).await.unwrap();
    let exec = |argv: Vec<String>| {
        let session = &session;
        async move { attempt(session, json!({"op": "exec", "argv": argv})).await }
    };
    let url = |port: u16| format!("http://127.0.0.1:{port}/");
    let node = |url: String| {
        vec![
            "node".to_owned(),
            "-e".to_owned(),
            format!(
                "fetch({url:?}).then(r => r.text()).then(t => console.log(t), e => {{ console.error(e.cause?.code ?? e.message); process.exit(1); }})"
            ),
        ]
    };
    let python = |library: &str, url: String| {
        let get = match library {
            "requests" => format!("import requests; print(requests.get({url:?}, timeout=10).text)"),
            _ => format!("import httpx; print(httpx.get({url:?}, timeout=10).text)"),
        };
        vec!["/usr/bin/python3".to_owned(), "-c".to_owned(), get]
    };
    let curl = |url: String, direct: bool| {
        let mut argv = vec![
            "curl".to_owned(),
            "-sS".to_owned(),
            "--max-time".to_owned(),
            "10".to_owned(),
        ];
        if direct {
            argv.extend(["--noproxy".to_owned(), "*".to_owned()]);
        }
        argv.push(url);
        argv
    };
    let go_path = go.display().to_string();
    let go_get = move |url: String| vec![go_path.clone(), url];
    type Argv<'a> = Box<dyn Fn(String) -> Vec<String> + 'a>;
    let clients: Vec<(&str, Argv)> = vec![
        ("node fetch", Box::new(node)),
        ("python requests", Box::new(move |u| python("requests", u))),
        ("python httpx", Box::new(move |u| python("httpx", u))),
        ("go net/http", Box::new(go_get)),
        ("curl, direct", Box::new(move |u| curl(u, true))),
        ("curl, through the proxy", Box::new(move |u| curl(u, false))),
    ];
    for (client, argv) in &clients {
        let reached = exec(argv(url(granted))).await;
        assert_eq!(reached.as_deref(), Ok("granted service A"), "{client}");
        // Refused: an error, or (a client that reads a 403 as an answer)
        // the proxy's refusal.
        let error = match exec(argv(url(ungranted))).await {
            Ok(text) | Err(text) => text,
        };
        assert!(
            !error.contains("ungranted service"),
            "{client} reached an ungranted service: {error}"
        );
        assert!(
            [
                "ECONNREFUSED",
                "Connection refused",
                "connection refused",
                "EACCES",
                "Permission denied",
                "permission denied",
                "403",
                "is not in this server's net grants",
                "Couldn't connect to server"
            ]
            .iter()
            .any(|needle| error.contains(needle)),
            "{client}: {error}"
        );
    }
    let psql = |port: u16| {
        vec![
            "psql".to_owned(),
            format!(
                "host=127.0.0.1 port={port} user=moat dbname=moat connect_timeout=10 sslmode=disable"
            ),
            "-c".to_owned(),
            "select 1".to_owned(),
        ]
    };
    let reached = exec(psql(postgres)).await.unwrap_err();
    assert!(
        reached.contains("FATAL:  granted postgres reached"),
        "{reached}"
    );
    let refused = exec(psql(ungranted)).await.unwrap_err();
    assert!(
        refused.contains("Connection refused") || refused.contains("Permission denied"),
        "{refused}"
    );

    // 10.255.255.1 is the namespace's own (an alias of lo, where Moat's
    // relay listens on the granted port): another port there is refused at
    // once, where without the alias it would have no route.
    let alias = attempt(
        &session,
        json!({"op": "connect", "addr": format!("10.255.255.1:{postgres}")}),
    )
    .await;
    assert_eq!(alias, Err("Connection refused (os error 111)".to_owned()));

    // The name: pinned at launch, whatever it resolves to later.
    for argv in [
        curl(format!("http://svc.test:{granted}/"), true),
        node(format!("http://svc.test:{granted}/")),
    ] {
        assert_eq!(exec(argv).await.as_deref(), Ok("granted service A"));
    }
    assert!(launched.load(Ordering::SeqCst), "svc.test was looked up");
    let unlisted = exec(curl(format!("http://other.test:{granted}/"), true))
        .await
        .unwrap_err();
    assert!(
        unlisted.contains("Could not resolve host: other.test"),
        "{unlisted}"
    );
    assert!(
        refusals
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.server == "probe" && r.destination == "other.test"),
        "{refusals:?}"
    );
    session.close().await.unwrap();

    // A new launch looks the name up again: now it is service B's.
    let session = host.connect(&spec).await.unwrap();
    let later = attempt(
        &session,
        json!({"op": "exec", "argv": curl(format!("http://svc.test:{granted}/"), true)}),
    )
    .await;
    assert_eq!(
        later.as_deref(),
        Ok("service B, where the name points later")
    );
    session.close().await.unwrap();
}
