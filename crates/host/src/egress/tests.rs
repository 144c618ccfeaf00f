use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};

use super::dns::answer_dns;
use super::proxy::{Target, allowed_by, host_port, parse_head};
use super::shares::Recorder;
use super::*;
use crate::grants::NetGrant;

#[test]
fn dns_answers_listed_names_with_their_relay_address_and_nothing_else() {
    use simple_dns::{CLASS, Name, Packet, PacketFlag, QCLASS, QTYPE, Question, RCODE, TYPE};
    let names = HashMap::from([("api.example".to_owned(), Ipv4Addr::new(127, 100, 0, 1))]);
    let query = |name: &str, kind: TYPE| {
        let mut packet = Packet::new_query(42);
        packet.set_flags(PacketFlag::RECURSION_DESIRED);
        packet.questions.push(Question::new(
            Name::new_unchecked(name),
            QTYPE::TYPE(kind),
            QCLASS::CLASS(CLASS::IN),
            false,
        ));
        packet.build_bytes_vec().unwrap()
    };
    let reply = |bytes: Vec<u8>| {
        let (answer, refused) = answer_dns(&bytes, &names).unwrap();
        let packet = Packet::parse(&answer).unwrap();
        let records: Vec<String> = packet
            .answers
            .iter()
            .map(|r| format!("{:?}", r.rdata))
            .collect();
        (packet.id(), packet.rcode(), records, refused)
    };
    let (id, rcode, records, refused) = reply(query("API.example.", TYPE::A));
    assert_eq!((id, rcode, refused), (42, RCODE::NoError, None));
    assert_eq!(records.len(), 1, "{records:?}");
    let address = u32::from(Ipv4Addr::new(127, 100, 0, 1));
    assert!(records[0].contains(&address.to_string()), "{records:?}");
    // No AAAA: clients use the relay's IPv4 address.
    let (_, rcode, records, _) = reply(query("api.example", TYPE::AAAA));
    assert_eq!((rcode, records.len()), (RCODE::NoError, 0));
    let (_, rcode, records, _) = reply(query("api.example", TYPE::TXT));
    assert_eq!((rcode, records.len()), (RCODE::NoError, 0));
    let (_, rcode, records, refused) = reply(query("exfil.attacker.example", TYPE::A));
    assert_eq!((rcode, records.len()), (RCODE::NameError, 0));
    assert_eq!(refused.as_deref(), Some("exfil.attacker.example"));
    let (_, rcode, _, refused) = reply(query("1.0.100.127.in-addr.arpa", TYPE::PTR));
    assert_eq!(
        (rcode, refused),
        (RCODE::NameError, None),
        "reverse lookups are not recorded"
    );
    let mut empty = Packet::new_query(7);
    empty.set_flags(PacketFlag::RECURSION_DESIRED);
    let (_, rcode, _, _) = reply(empty.build_bytes_vec().unwrap());
    assert_eq!(rcode, RCODE::FormatError);
    assert!(answer_dns(b"not dns", &names).is_none());
    let response = answer_dns(&query("api.example", TYPE::A), &names)
        .unwrap()
        .0;
    assert!(
        answer_dns(&response, &names).is_none(),
        "a reply is not answered"
    );
}

fn grant(host: &str, port: u16) -> NetGrant {
    NetGrant {
        host: host.into(),
        port,
    }
}

#[test]
fn each_entry_gets_a_listener_inside_names_an_address_of_their_own() {
    let grants = [
        grant("API.example.", 443),
        grant("api.example", 80),
        grant("db.internal", 5432),
        grant("127.100.0.2", 9000),
        grant("127.0.0.1", 8080),
        grant("10.1.2.3", 6379),
        grant("localhost", 7000),
        grant("::1", 7001),
        grant("2001:db8::5", 443),
        grant("127.0.0.1", PROXY_PORT),
        grant("api.example", 443),
    ];
    let layout = Layout::of(&grants, true);
    assert_eq!(
        layout.names,
        [
            ("api.example".to_owned(), Ipv4Addr::new(127, 100, 0, 1)),
            // 127.100.0.2 is a literal entry's: the next name skips it.
            ("db.internal".to_owned(), Ipv4Addr::new(127, 100, 0, 3)),
        ]
    );
    let inside: Vec<String> = layout.relays.iter().map(|r| r.inside.to_string()).collect();
    assert_eq!(
        inside,
        [
            "127.100.0.1:443",
            "127.100.0.1:80",
            "127.100.0.3:5432",
            "127.100.0.2:9000",
            "127.0.0.1:8080",
            "10.1.2.3:6379",
            "127.0.0.1:7000",
            "[::1]:7001",
        ]
    );
    assert_eq!(layout.aliases, [Ipv4Addr::new(10, 1, 2, 3)]);
    assert_eq!(
        layout.proxy_only,
        [grant("2001:db8::5", 443), grant("127.0.0.1", PROXY_PORT)]
    );
    let without_v6 = Layout::of(&[grant("::1", 7001)], false);
    assert!(without_v6.relays.is_empty());
    assert_eq!(without_v6.proxy_only, [grant("::1", 7001)]);
    assert_eq!(listed_names(&grants), ["api.example", "db.internal"]);
}

#[test]
fn public_addresses_are_told_from_the_rest() {
    for ip in [
        "93.184.215.14",
        "2606:4700::6810:84e5",
        "::ffff:93.184.215.14",
    ] {
        assert!(public(ip.parse().unwrap()), "{ip}");
    }
    for ip in [
        "127.0.0.1",
        "10.0.0.5",
        "172.16.3.4",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "255.255.255.255",
        "192.0.2.7",
        "::1",
        "::",
        "fd00::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "2001:db8::1",
    ] {
        assert!(!public(ip.parse().unwrap()), "{ip}");
    }
}

#[tokio::test]
async fn names_are_pinned_at_launch_and_non_public_answers_need_the_address_granted() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = asked.clone();
    let lookup = Lookup::new(move |name: String| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            match name.as_str() {
                "api.example" => Ok(vec![
                    "93.184.215.14".parse().unwrap(),
                    "10.0.0.9".parse().unwrap(),
                ]),
                "metadata.example" => Ok(vec!["169.254.169.254".parse().unwrap()]),
                "db.test" => Ok(vec!["127.0.0.1".parse().unwrap()]),
                "empty.example" => Ok(vec![]),
                _ => Err(std::io::Error::other("no such name")),
            }
        }
    });
    let grants = [
        grant("api.example", 443),
        grant("api.example", 80),
        grant("metadata.example", 80),
        grant("db.test", 5432),
        grant("127.0.0.1", 5432),
        grant("empty.example", 443),
        grant("gone.example", 443),
        grant("localhost", 7000),
    ];
    let pinned = pin(&grants, &lookup).await;
    assert_eq!(
        asked.load(Ordering::SeqCst),
        5,
        "each name is looked up once"
    );
    let ok = |host: &str, port| pinned.targets(host, port).unwrap().clone().unwrap();
    let err = |host: &str, port| pinned.targets(host, port).unwrap().clone().unwrap_err();
    assert_eq!(
        ok("API.example.", 443),
        ["93.184.215.14:443".parse().unwrap()]
    );
    assert_eq!(ok("api.example", 80), ["93.184.215.14:80".parse().unwrap()]);
    assert_eq!(
        err("metadata.example", 80),
        "resolved at launch to 169.254.169.254 only, not a public address; a name's loopback, private and link-local addresses are reached only when granted by address too (add \"169.254.169.254:80\" to `net`)"
    );
    assert_eq!(ok("db.test", 5432), ["127.0.0.1:5432".parse().unwrap()]);
    assert_eq!(
        err("empty.example", 443),
        "resolved at launch to no address"
    );
    assert_eq!(
        err("gone.example", 443),
        "did not resolve at launch: no such name"
    );
    assert_eq!(
        ok("localhost", 7000),
        [
            "127.0.0.1:7000".parse().unwrap(),
            "[::1]:7000".parse().unwrap()
        ]
    );
    assert!(pinned.targets("api.example", 8443).is_none());
}

#[test]
fn refusals_are_told_once_each_and_a_flood_is_cut_short() {
    let told = Arc::new(Mutex::new(Vec::new()));
    let sink = told.clone();
    let recorder = Recorder {
        server: "probe".into(),
        observer: Some(Observer::new(move |refusal| {
            sink.lock().unwrap().push(refusal)
        })),
        seen: Mutex::default(),
    };
    recorder.refused("evil.example", "not listed");
    recorder.refused("evil.example", "not listed");
    assert_eq!(
        *told.lock().unwrap(),
        [Refusal {
            server: "probe".into(),
            destination: "evil.example".into(),
            reason: "not listed".into()
        }]
    );
    for i in 0..200 {
        recorder.refused(&format!("n{i}.example"), "not listed");
    }
    let told = told.lock().unwrap();
    assert_eq!(told.len(), MAX_RECORDED + 1);
    assert_eq!(told[MAX_RECORDED].destination, "*");
    assert!(
        told[MAX_RECORDED]
            .reason
            .contains("the rest are not recorded")
    );
}

#[test]
fn connections_take_a_slot_in_every_pool_and_the_refusal_names_the_full_one() {
    let gateway = Pool::new(3, "gateway");
    let session = Pool::new(2, "session");
    let shares = Shares::gateway(8, gateway.clone());
    let spare = shares.detached();
    let (one, two) = (Pool::new(8, "server"), Pool::new(8, "server"));
    // Before a session takes it over, only the gateway bounds it.
    let first = spare.take(&one).unwrap();
    assert_eq!((gateway.in_use(), session.in_use()), (1, 0));
    spare.adopt(&session);
    let second = spare.take(&one).unwrap();
    let in_session = shares.in_session(&session);
    let third = in_session.take(&two).unwrap();
    assert_eq!((gateway.in_use(), session.in_use()), (3, 2));
    assert_eq!(
        in_session.take(&two).unwrap_err(),
        "egress connection limit (2 per session) reached"
    );
    assert_eq!(two.in_use(), 1, "a refusal holds no slot anywhere");
    drop(first);
    let fourth = Shares::gateway(8, gateway.clone())
        .take(&Pool::new(8, "server"))
        .unwrap();
    let over = Shares::gateway(8, gateway.clone()).take(&Pool::new(8, "server"));
    assert_eq!(
        over.unwrap_err(),
        "egress connection limit (3 per gateway) reached"
    );
    let own = Pool::new(1, "server");
    let _only = Shares::default().take(&own).unwrap();
    assert_eq!(
        Shares::default().take(&own).unwrap_err(),
        "egress connection limit (1 per server) reached"
    );
    drop((second, third, fourth));
    assert_eq!((gateway.in_use(), session.in_use()), (0, 0));
}

#[test]
fn heads_are_parsed_and_destinations_matched_by_name() {
    let (target, _) =
        parse_head("CONNECT api.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(
        target,
        Target {
            host: "api.example.com".into(),
            port: 443,
            tunnel: true
        }
    );
    let (target, head) = parse_head(
            "GET http://127.0.0.1:8080/page?q=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nProxy-Authorization: x\r\nConnection: keep-alive\r\n\r\n",
        )
        .unwrap();
    assert_eq!(
        (target.host.as_str(), target.port, target.tunnel),
        ("127.0.0.1", 8080, false)
    );
    assert_eq!(
        head,
        "GET /page?q=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nConnection: close\r\n\r\n"
    );
    assert!(parse_head("GET /relative HTTP/1.1\r\n\r\n").is_err());
    let allowed = [NetGrant {
        host: "API.example.com".into(),
        port: 443,
    }];
    assert!(allowed_by(&allowed, "api.example.com.", 443));
    assert!(!allowed_by(&allowed, "api.example.com", 80));
    assert!(!allowed_by(&allowed, "evil.example.com", 443));
    assert_eq!(host_port("[::1]:8080", 80), Some(("::1".into(), 8080)));
}

/// Whether the socket of this process that `matches` sends each write at
/// once (`TCP_NODELAY`); `None` when no socket matches. Each descriptor is
/// duplicated before it is looked at, so one that another thread closes
/// meanwhile is skipped (or, reused, fails the match), never misused.
fn own_socket_sends_at_once(matches: impl Fn(&std::net::TcpStream) -> bool) -> Option<bool> {
    use std::os::fd::FromRawFd;
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let Ok(fd) = entry.unwrap().file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes a descriptor number and
        // returns a new descriptor (or -1 when it is not open); nothing is
        // borrowed.
        let own = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if own < 0 {
            continue;
        }
        // SAFETY: `own` was just made for this function and nothing else
        // holds it; the TcpStream closes it once. On anything not a TCP
        // socket its calls fail and it does not match.
        let stream = unsafe { std::net::TcpStream::from_raw_fd(own) };
        if matches(&stream) {
            return Some(stream.nodelay().unwrap());
        }
    }
    None
}

#[tokio::test]
async fn both_of_moats_ends_of_a_relayed_connection_send_each_write_at_once() {
    // The upstream: a listener of the test's, granted by address.
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grants = vec![grant("127.0.0.1", upstream.local_addr().unwrap().port())];
    let layout = Layout::of(&grants, false);
    assert_eq!(layout.relays.len(), 1);
    // The relay's listener, on loopback here rather than in a namespace.
    let relay = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_address = relay.local_addr().unwrap();
    let sockets = Sockets {
        proxy: std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        dns: std::net::UdpSocket::bind("127.0.0.1:0").unwrap(),
        relays: vec![relay],
    };
    let task = serve(
        "probe".into(),
        sockets,
        layout,
        grants,
        Shares::gateway(4, Pool::new(4, "gateway")),
    )
    .unwrap();
    // The server's connection to the relay, and the one Moat makes for it.
    let mut server = TcpStream::connect(relay_address).await.unwrap();
    let (mut far, _) = upstream.accept().await.unwrap();
    // A byte through the relay: it copies only once both ends are set up.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    server.write_all(b"x").await.unwrap();
    let mut byte = [0u8; 1];
    far.read_exact(&mut byte).await.unwrap();
    let (server_end, far_end) = (server.local_addr().unwrap(), far.peer_addr().unwrap());
    let accepted = own_socket_sends_at_once(|s| s.peer_addr().is_ok_and(|a| a == server_end));
    let connected = own_socket_sends_at_once(|s| s.local_addr().is_ok_and(|a| a == far_end));
    task.abort();
    assert_eq!(
        (accepted, connected),
        (Some(true), Some(true)),
        "Moat's end of the server's connection, and of its connection upstream"
    );
}
