//! The egress sockets of a server behind Moat: made by the child inside its
//! network namespace before exec (the proxy's listener, the DNS socket, a
//! listener per relay, `lo`'s aliases) and handed to Moat over a socket
//! pair, one descriptor per message.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::{SpawnFailure, Step, errno, fail};

/// Where the child's egress sockets go, and what it makes.
pub struct ProxyPlan {
    /// The child's end of a Unix socket pair.
    pub channel: RawFd,
    pub port: u16,
    /// IPv4 addresses to add to `lo` (as `lo:1`, `lo:2`, ...).
    pub aliases: Vec<[u8; 4]>,
    /// The relay listeners' addresses, in the order they are handed over.
    pub relays: Vec<std::net::SocketAddr>,
}

/// A Unix socket pair for handing the egress listener over: (Moat's end,
/// the child's end), both close-on-exec and above 2.
pub fn proxy_channel() -> Result<(OwnedFd, OwnedFd), SpawnFailure> {
    let mut ends = [-1i32; 2];
    // SAFETY: socketpair writes two descriptors into `ends`, which we then
    // own.
    let (moat, child) = unsafe {
        if libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            ends.as_mut_ptr(),
        ) != 0
        {
            return Err(SpawnFailure::Parent(
                "socketpair",
                std::io::Error::last_os_error(),
            ));
        }
        (
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ends[0]),
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ends[1]),
        )
    };
    let high = |fd: OwnedFd| {
        rustix::io::fcntl_dupfd_cloexec(&fd, 3)
            .map_err(|e| SpawnFailure::Parent("fcntl(F_DUPFD_CLOEXEC)", e.into()))
    };
    Ok((high(moat)?, high(child)?))
}

/// Space for one descriptor's control message, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct OneFdControl([u8; 32]);

/// Receives the egress listener the child sent on `moat` (it was sent
/// before exec, so it is waiting).
pub fn receive_listener(moat: &OwnedFd) -> std::io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = OneFdControl([0; 32]);
    // SAFETY: recvmsg fills `byte` and `control`, both live for the call;
    // the control message is read through libc's CMSG accessors within the
    // buffer's bounds, and the descriptor it carries is then ours.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = control.0.len() as _;
        if libc::recvmsg(
            moat.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        ) != 1
        {
            return Err(std::io::Error::last_os_error());
        }
        let header = libc::CMSG_FIRSTHDR(&msg);
        if header.is_null()
            || (*header).cmsg_level != libc::SOL_SOCKET
            || (*header).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(std::io::Error::other("no descriptor in the message"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<i32>());
        Ok(<OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd))
    }
}

/// Sends `fd` over `channel` with one byte, as SCM_RIGHTS.
///
/// # Safety
///
/// Only in the cloned child; `fd` and `channel` are open descriptors.
unsafe fn send_fd(channel: RawFd, fd: RawFd, report: RawFd) {
    // SAFETY: sendmsg reads stack memory that lives for the call; the
    // control message is written through libc's CMSG accessors within the
    // buffer's bounds.
    unsafe {
        let mut byte = [b'l'];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut control = OneFdControl([0; 32]);
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) as _;
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<i32>(), fd);
        if libc::sendmsg(channel, &msg, 0) != 1 {
            fail(report, Step::ProxyHandOver, errno());
        }
        libc::close(fd);
    }
}

/// Makes the egress listener and the DNS socket in the child and hands
/// them to Moat, in that order.
///
/// # Safety
///
/// Only in the cloned child, in its own network namespace, while it still
/// holds CAP_NET_ADMIN there.
pub(super) unsafe fn hand_over_listener(proxy: &ProxyPlan, report: RawFd) {
    // SAFETY: raw system calls on stack memory; see the contract.
    unsafe {
        let check = |ok: bool, step: Step| {
            if !ok {
                fail(report, step, errno());
            }
        };
        let control_socket = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        check(control_socket >= 0, Step::ProxyLoopback);
        let mut request: libc::ifreq = std::mem::zeroed();
        request.ifr_name[0] = b'l' as libc::c_char;
        request.ifr_name[1] = b'o' as libc::c_char;
        request.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        check(
            libc::ioctl(control_socket, libc::SIOCSIFFLAGS, &request) == 0,
            Step::ProxyLoopback,
        );
        libc::close(control_socket);
        // A socket of `kind` bound to 127.0.0.1:`port` of the namespace.
        let bound = |kind: i32, port: u16, step: Step| {
            let fd = libc::socket(libc::AF_INET, kind | libc::SOCK_CLOEXEC, 0);
            check(fd >= 0, step);
            let mut address: libc::sockaddr_in = std::mem::zeroed();
            address.sin_family = libc::AF_INET as libc::sa_family_t;
            address.sin_port = port.to_be();
            address.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
            check(
                libc::bind(
                    fd,
                    (&address as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                ) == 0,
                step,
            );
            fd
        };
        let listener = bound(libc::SOCK_STREAM, proxy.port, Step::ProxyListen);
        check(libc::listen(listener, 128) == 0, Step::ProxyListen);
        // The DNS socket: 127.0.0.1:53 of the namespace, where its
        // resolv.conf points.
        let dns = bound(libc::SOCK_DGRAM, crate::egress::DNS_PORT, Step::DnsListen);
        send_fd(proxy.channel, listener, report);
        send_fd(proxy.channel, dns, report);
        // Granted addresses outside 127.0.0.0/8 become lo's own (a /32
        // each), so a connection to one stays inside, at Moat's relay.
        for (index, octets) in proxy.aliases.iter().enumerate() {
            let control = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
            check(control >= 0, Step::ProxyAlias);
            let mut request: libc::ifreq = std::mem::zeroed();
            // "lo:N", N = index + 1 (at most 5 digits: IFNAMSIZ is 16).
            let label = index + 1;
            let mut digits = [0u8; 5];
            let mut count = 0;
            let mut rest = label;
            loop {
                digits[count] = b'0' + (rest % 10) as u8;
                count += 1;
                rest /= 10;
                if rest == 0 || count == digits.len() {
                    break;
                }
            }
            for (at, byte) in b"lo:".iter().enumerate() {
                request.ifr_name[at] = *byte as libc::c_char;
            }
            for at in 0..count {
                request.ifr_name[3 + at] = digits[count - 1 - at] as libc::c_char;
            }
            let set = |request: &mut libc::ifreq, address: [u8; 4], call: libc::c_ulong| {
                let mut sin: libc::sockaddr_in = std::mem::zeroed();
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_addr.s_addr = u32::from_be_bytes(address).to_be();
                std::ptr::write_unaligned(
                    std::ptr::addr_of_mut!(request.ifr_ifru.ifru_addr).cast::<libc::sockaddr_in>(),
                    sin,
                );
                check(
                    libc::ioctl(control, call as _, request as *mut libc::ifreq) == 0,
                    Step::ProxyAlias,
                );
            };
            set(&mut request, *octets, libc::SIOCSIFADDR);
            set(&mut request, [255, 255, 255, 255], libc::SIOCSIFNETMASK);
            libc::close(control);
        }
        for address in &proxy.relays {
            let fd = match address {
                std::net::SocketAddr::V4(v4) => {
                    let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                    check(fd >= 0, Step::RelayListen);
                    let mut sin: libc::sockaddr_in = std::mem::zeroed();
                    sin.sin_family = libc::AF_INET as libc::sa_family_t;
                    sin.sin_port = v4.port().to_be();
                    sin.sin_addr.s_addr = u32::from_be_bytes(v4.ip().octets()).to_be();
                    check(
                        libc::bind(
                            fd,
                            (&sin as *const libc::sockaddr_in).cast(),
                            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                        ) == 0,
                        Step::RelayListen,
                    );
                    fd
                }
                std::net::SocketAddr::V6(v6) => {
                    let fd =
                        libc::socket(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                    check(fd >= 0, Step::RelayListen);
                    let mut sin6: libc::sockaddr_in6 = std::mem::zeroed();
                    sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                    sin6.sin6_port = v6.port().to_be();
                    sin6.sin6_addr.s6_addr = v6.ip().octets();
                    check(
                        libc::bind(
                            fd,
                            (&sin6 as *const libc::sockaddr_in6).cast(),
                            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                        ) == 0,
                        Step::RelayListen,
                    );
                    fd
                }
            };
            check(libc::listen(fd, 128) == 0, Step::RelayListen);
            send_fd(proxy.channel, fd, report);
        }
        libc::close(proxy.channel);
    }
}
