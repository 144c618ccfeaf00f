//! An answer leaves as it is written. Over streamable HTTP the server
//! writes an answer in pieces (the headers with the SSE event, then the
//! chunked body's end); with Nagle's algorithm on its end of the
//! connection, the last piece waited for the agent's acknowledgement of
//! the first, which an agent's kernel delays by up to 40 ms: every call
//! took 40 ms or more. The test reads the option off the server's own end
//! of the agent's connection, which it takes from the running server with
//! `pidfd_getfd` (the server is its child).

use std::os::fd::FromRawFd;

use super::*;

/// The server's end of the connection whose peer is `agent`, as this
/// process's own descriptor, found among the server's sockets.
fn servers_end(pid: u32, agent: std::net::SocketAddr) -> TcpStream {
    // SAFETY: pidfd_open takes a pid and flags and returns a new
    // descriptor (or -1); nothing is borrowed.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    assert!(
        pidfd >= 0,
        "pidfd_open({pid}): {}",
        std::io::Error::last_os_error()
    );
    let pidfd = pidfd as i32;
    let mut found = None;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let entry = entry.unwrap();
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        let Ok(target_fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if !is_socket {
            continue;
        }
        // SAFETY: pidfd_getfd takes a pidfd, a descriptor number in that
        // process and flags, and returns a new descriptor of ours (or -1).
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, target_fd, 0) };
        if fd < 0 {
            // Closed since the listing: not the one sought.
            continue;
        }
        // SAFETY: `fd` is a socket descriptor just made for this process
        // and owned by nothing else; the TcpStream closes it once.
        let stream = unsafe { TcpStream::from_raw_fd(fd as i32) };
        if stream.peer_addr().is_ok_and(|peer| peer == agent) {
            found = Some(stream);
            break;
        }
    }
    // SAFETY: the descriptor is ours and closed once.
    unsafe { libc::close(pidfd) };
    found.unwrap_or_else(|| panic!("no socket of the server has {agent} as its peer"))
}

#[test]
fn the_servers_end_of_an_agents_connection_sends_each_write_at_once() {
    let server = Server::start(SMALL);
    let mut agent = TcpStream::connect(&server.address).unwrap();
    agent
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    // One whole exchange on a connection kept open: by its answer the
    // server has accepted the connection and set it up.
    write!(
        agent,
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{INITIALIZE}",
        server.address,
        INITIALIZE.len()
    )
    .unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).contains("\"serverInfo\"") {
        let n = agent.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "closed before the answer: {:?}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&chunk[..n]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"));

    let end = servers_end(server.child.id(), agent.local_addr().unwrap());
    assert!(
        end.nodelay().unwrap(),
        "the server's end of the agent's connection has Nagle's algorithm on"
    );
}
