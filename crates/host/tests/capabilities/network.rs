//! Network grants: a listed port connects and others are denied (a native
//! server's only through the proxy), no network without a grant, and name
//! lookups answer only the names `net` lists (native DNS, wasm lookups).

use super::*;

both_launchers!(
    a_listed_port_connects_and_others_are_denied,
    no_network_without_a_grant,
);

/// A loopback server answering `pong` to every connection.
fn pong_server() -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut buf = [0u8; 5];
            let _ = stream.read(&mut buf);
            if &buf[..4] == b"quit" {
                return;
            }
            let _ = stream.write_all(b"pong");
        }
    });
    (port, handle)
}

fn stop(port: u16, handle: std::thread::JoinHandle<()>) {
    if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
        let _ = stream.write_all(b"quit\n");
    }
    let _ = handle.join();
}

async fn a_listed_port_connects_and_others_are_denied(launcher: Launcher) {
    let (listed, listed_server) = pong_server();
    let (unlisted, unlisted_server) = pong_server();
    let mut spec = spec(launcher, guests::PROBE);
    spec.net = vec![NetGrant {
        host: "127.0.0.1".into(),
        port: listed,
    }];
    if launcher == Launcher::Native {
        native_egress_goes_through_the_proxy_only(spec, listed, unlisted).await;
        stop(listed, listed_server);
        stop(unlisted, unlisted_server);
        return;
    }
    let session = connect(&spec).await;
    let ok = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.1:{listed}")}),
    )
    .await;
    assert_eq!(ok.as_deref(), Ok("pong"));
    let other_port = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.1:{unlisted}")}),
    )
    .await;
    assert_denied(launcher, Denial::Network, other_port, "an unlisted port");
    let other_host = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.2:{listed}")}),
    )
    .await;
    assert_denied(launcher, Denial::Network, other_host, "an unlisted host");
    session.close().await.unwrap();
    stop(listed, listed_server);
    stop(unlisted, unlisted_server);
}

/// Issue 13, and issue 33 item 5: a native server with `net` grants runs,
/// under the default `required` sandbox, in a network namespace whose only
/// ways out are Moat's: the listed host and port are reached through the
/// proxy and directly (Moat's relay listens there inside); an unlisted port
/// or host (or the same address by another name) gets 403 from the proxy,
/// and directly it is refused at once or has no route.
async fn native_egress_goes_through_the_proxy_only(spec: ServerSpec, listed: u16, unlisted: u16) {
    assert_eq!(spec.sandbox, Sandbox::Required);
    let session = connect(&spec).await;
    let sandbox = session.identity().unwrap().sandbox;
    assert!(
        sandbox.lines().iter().any(|l| l
            .starts_with(&format!("enforced: network namespace: out only through Moat, to 127.0.0.1:{listed} at the addresses resolved at launch: relayed transparently (127.0.0.1:{listed}), and through the proxy at 127.0.0.1:3128"))),
        "{sandbox:?}"
    );
    let through = attempt(
        &session,
        json!({"op": "proxy", "addr": format!("127.0.0.1:{listed}")}),
    )
    .await;
    assert_eq!(through.as_deref(), Ok("pong"));
    for refused in [
        format!("127.0.0.1:{unlisted}"),
        format!("127.0.0.2:{listed}"),
        format!("localhost:{listed}"),
    ] {
        let answer = attempt(&session, json!({"op": "proxy", "addr": refused})).await;
        assert_eq!(
            answer,
            Err(format!(
                "HTTP/1.1 403 Forbidden moat: {refused} is not in this server's net grants"
            ))
        );
    }
    let direct = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.1:{listed}")}),
    )
    .await;
    assert_eq!(
        direct.as_deref(),
        Ok("pong"),
        "the relay reaches the listed port"
    );
    // An unlisted port: Landlock's TCP rule refuses the connect (EACCES;
    // on a kernel without Landlock's TCP rules, nothing listens there).
    let direct = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.1:{unlisted}")}),
    )
    .await
    .unwrap_err();
    assert!(
        [
            "Permission denied (os error 13)",
            "Connection refused (os error 111)"
        ]
        .contains(&direct.as_str()),
        "{direct}"
    );
    for (unlisted, error) in [
        (
            format!("127.0.0.2:{listed}"),
            "Connection refused (os error 111)",
        ),
        (
            format!("192.0.2.7:{listed}"),
            "Network is unreachable (os error 101)",
        ),
    ] {
        let direct = attempt(&session, json!({"op": "connect", "addr": unlisted})).await;
        assert_eq!(direct, Err(error.to_owned()), "{unlisted}");
    }
    session.close().await.unwrap();
}

async fn no_network_without_a_grant(launcher: Launcher) {
    let (port, server) = pong_server();
    let session = connect(&spec(launcher, guests::PROBE)).await;
    let outcome = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.1:{port}")}),
    )
    .await;
    assert_denied(
        launcher,
        Denial::Network,
        outcome,
        "a connect without any net grant",
    );
    let sandbox = session.identity().unwrap().sandbox;
    assert!(
        sandbox
            .lines()
            .iter()
            .any(|l| l.starts_with("enforced: network")
                && (l.ends_with("none") || l.ends_with("no TCP connect or bind"))),
        "{sandbox:?}"
    );
    session.close().await.unwrap();
    stop(port, server);
}

/// Behind Moat's egress, DNS is Moat's: /etc/resolv.conf points at
/// 127.0.0.1 in the server's namespace, where a name its `net` lists gets
/// its relay address inside the namespace and any other name is NXDOMAIN,
/// so no query reaches a resolver; the refusal is told to the observer
/// (the gateway's writes it to the audit log).
#[tokio::test]
async fn native_dns_answers_the_listed_names_only() {
    let listed = "registry.npmjs.org";
    let mut spec = spec(Launcher::Native, guests::PROBE);
    spec.net = vec![NetGrant {
        host: listed.into(),
        port: 443,
    }];
    let refusals = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = refusals.clone();
    let host = common::host().with_egress(
        moat_host::egress::Shares::default()
            .with_lookup(moat_host::egress::Lookup::new(|_name: String| async {
                Ok(vec!["93.184.215.14".parse().unwrap()])
            }))
            .observe(moat_host::egress::Observer::new(move |refusal| {
                seen.lock().unwrap().push(refusal)
            })),
    );
    let session = host.connect(&spec).await.unwrap();
    let sandbox = session.identity().unwrap().sandbox;
    assert!(
        sandbox.lines().iter().any(|l| l.starts_with(
            "enforced: DNS: answered by Moat at 127.0.0.1:53 (resolv.conf covered, read-only), for registry.npmjs.org only (each with its relay address); any other name is NXDOMAIN"
        )),
        "{sandbox:?}"
    );
    let answer = attempt(
        &session,
        json!({"op": "resolve", "addr": format!("{listed}:443")}),
    )
    .await;
    assert_eq!(
        answer.as_deref(),
        Ok("127.100.0.1"),
        "the listed name resolves to its relay"
    );
    let refused = attempt(&session, json!({"op": "resolve", "addr": "pypi.org:443"})).await;
    assert!(
        refusals
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.destination == "pypi.org"
                && r.reason == "not in this server's net grants (DNS answered NXDOMAIN)"),
        "{refusals:?}"
    );
    // NXDOMAIN: no such name, at once.
    assert_eq!(
        refused,
        Err("failed to lookup address information: Name or service not known".to_owned())
    );
    let conf = attempt(&session, json!({"op": "read", "path": "/etc/resolv.conf"})).await;
    assert!(conf.unwrap().contains("nameserver 127.0.0.1"));
    let write = attempt(&session, json!({"op": "write", "path": "/etc/resolv.conf"})).await;
    assert!(write.is_err(), "{write:?}");
    session.close().await.unwrap();
}

/// Issue 12, item 4: a wasm guest looks up only the names its `net` lists,
/// answered from the launch-time resolution: nothing else reaches a
/// resolver (DNS is no channel out), and a flood of lookups costs the host
/// nothing on its blocking pool.
#[tokio::test]
async fn a_wasm_guest_looks_up_only_the_names_net_lists() {
    let (port, server) = pong_server();
    let mut spec = spec(Launcher::Wasm, guests::PROBE);
    spec.net = vec![NetGrant {
        host: "localhost".into(),
        port,
    }];
    let session = connect(&spec).await;
    let listed = attempt(
        &session,
        json!({"op": "resolve", "addr": format!("localhost:{port}")}),
    )
    .await
    .unwrap();
    assert!(listed.split(',').any(|a| a == "127.0.0.1"), "{listed}");
    let connected = attempt(
        &session,
        json!({"op": "connect", "addr": format!("LocalHost.:{port}")}),
    )
    .await;
    assert_eq!(connected.as_deref(), Ok("pong"));
    session.close().await.unwrap();

    // Granted by address only: the name that /etc/hosts maps to that very
    // address is still not looked up.
    spec.net = vec![NetGrant {
        host: "127.0.0.1".into(),
        port,
    }];
    let session = connect(&spec).await;
    let neighbour = connect(&common::spec(Launcher::Wasm, guests::EVERYTHING)).await;
    let (flood, echoed) = tokio::join!(
        attempt(
            &session,
            json!({"op": "resolve", "addr": format!("localhost:{port}"), "count": 10_000}),
        ),
        neighbour.call_tool("echo", args(json!({"message": "still here"})))
    );
    assert_eq!(flood.unwrap_err(), "Permission denied (os error 2)");
    assert_eq!(text(&echoed.unwrap()), "still here");
    let literal = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.1:{port}")}),
    )
    .await;
    assert_eq!(literal.as_deref(), Ok("pong"));
    session.close().await.unwrap();
    neighbour.close().await.unwrap();
    stop(port, server);
}
