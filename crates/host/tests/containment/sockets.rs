//! The hostile server against sockets: without `net` it reaches no socket
//! of the host (TCP, UDP, pathname or abstract Unix), and it opens sockets
//! in the allowed families only.

use super::*;

#[tokio::test]
async fn without_net_no_socket_of_the_host_is_reached() {
    use std::os::linux::net::SocketAddrExt;
    let neighbour = Neighbour::start().await;
    let dir = tempfile::tempdir().unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let path = dir.path().join("listener.sock");
    let unix = std::os::unix::net::UnixListener::bind(&path).unwrap();
    unix.set_nonblocking(true).unwrap();
    let name = format!("moat-test-{}", std::process::id());
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let abstract_listener = std::os::unix::net::UnixListener::bind_addr(&address).unwrap();
    abstract_listener.set_nonblocking(true).unwrap();
    let server = host().connect(&breakout()).await.unwrap();
    let cases = [
        (
            json!({"op": "udp", "addr": udp.local_addr().unwrap().to_string()}),
            libc::ENETUNREACH,
        ),
        (
            json!({"op": "tcp", "addr": tcp.local_addr().unwrap().to_string()}),
            // Landlock refuses the connect before routing would.
            libc::EACCES,
        ),
        (json!({"op": "unix", "path": path}), libc::EPERM),
        (json!({"op": "abstract", "name": name}), libc::EPERM),
    ];
    for (op, errno) in cases {
        let report = attack(&server, op.clone()).await;
        refused(&report, errno, &op.to_string());
        neighbour.answers().await;
    }
    let mut buf = [0u8; 16];
    assert_eq!(
        udp.recv_from(&mut buf).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "a datagram arrived"
    );
    for accepted in [
        tcp.accept().map(|_| ()),
        unix.accept().map(|_| ()),
        abstract_listener.accept().map(|_| ()),
    ] {
        assert_eq!(
            accepted.unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock,
            "a connection arrived"
        );
    }
    server.close().await.unwrap();
    neighbour.close().await;
}

/// Sockets open in AF_INET, AF_INET6 and AF_NETLINK (NETLINK_ROUTE) only
/// (AF_UNIX: socketpair only); every other family answers EAFNOSUPPORT,
/// whether the kernel has it or not.
#[tokio::test]
async fn sockets_open_only_in_the_allowed_families() {
    const AF_VSOCK: i32 = 40;
    const AF_ALG: i32 = 38;
    let neighbour = Neighbour::start().await;
    let server = host().connect(&breakout()).await.unwrap();
    let socket = |family: i32, kind: i32, protocol: i32| json!({"op": "socket", "family": family, "type": kind, "protocol": protocol});
    for (op, errno) in [
        (socket(AF_VSOCK, libc::SOCK_STREAM, 0), libc::EAFNOSUPPORT),
        (socket(AF_ALG, libc::SOCK_SEQPACKET, 0), libc::EAFNOSUPPORT),
        (
            socket(libc::AF_BLUETOOTH, libc::SOCK_STREAM, 0),
            libc::EAFNOSUPPORT,
        ),
        (
            socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_AUDIT),
            libc::EAFNOSUPPORT,
        ),
        (
            socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM,
                libc::NETLINK_KOBJECT_UEVENT,
            ),
            libc::EAFNOSUPPORT,
        ),
        (
            json!({"op": "socketpair", "family": AF_VSOCK, "type": libc::SOCK_STREAM}),
            libc::EAFNOSUPPORT,
        ),
        // SOCK_PACKET (10, obsolete) in AF_INET would be an AF_PACKET socket.
        (socket(libc::AF_INET, 10, 0x0300), libc::EPERM),
    ] {
        let report = attack(&server, op.clone()).await;
        refused(&report, errno, &op.to_string());
        neighbour.answers().await;
    }
    // What a server needs still opens, as it does here (IPv6 may be absent
    // from this kernel).
    for (family, kind, protocol) in [
        (libc::AF_INET, libc::SOCK_STREAM, 0),
        (libc::AF_INET, libc::SOCK_DGRAM, 0),
        (libc::AF_INET6, libc::SOCK_STREAM, 0),
        (libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE),
    ] {
        // SAFETY: socket(2) on plain integers; the descriptor is closed.
        let here = unsafe {
            let fd = libc::socket(family, kind, protocol);
            if fd >= 0 {
                libc::close(fd);
            }
            fd >= 0
        };
        let report = attack(&server, socket(family, kind, protocol)).await;
        assert_eq!(
            report["ok"],
            json!(here),
            "{family}/{kind}/{protocol}: {report}"
        );
    }
    let pair = attack(
        &server,
        json!({"op": "socketpair", "family": libc::AF_UNIX, "type": libc::SOCK_STREAM}),
    )
    .await;
    assert_eq!(pair["ok"], json!(true), "{pair}");
    let identity = server.identity().unwrap();
    assert!(
        identity.sandbox.lines().iter().any(|l| l.contains(
            "EAFNOSUPPORT for socket in any family but AF_UNIX, AF_INET, AF_INET6, AF_NETLINK (netlink: NETLINK_ROUTE only)"
        )),
        "{:#?}",
        identity.sandbox
    );
    server.close().await.unwrap();
    neighbour.close().await;
}
