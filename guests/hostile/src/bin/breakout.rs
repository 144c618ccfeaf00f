//! Tries to break out of a native sandbox, one way per `attack` call, and
//! reports what happened, so tests can assert the exact refusal. Arguments:
//! `{"op": ..., ...}`; the answer is JSON text, `{"ok": true, "data": ...}`
//! or `{"ok": false, "error": "...", "errno": N}`.
//!
//! - `signal` `{pid, signal}`: kill(pid, signal) on a process outside.
//! - `packet`: socket(AF_PACKET, SOCK_RAW); `raw`: socket(AF_INET, SOCK_RAW).
//! - `bpf`: bpf(BPF_MAP_CREATE); `klogctl`: syslog(SYSLOG_ACTION_SIZE_BUFFER).
//! - `ptrace` `{pid}`, `unshare` (a user namespace), `keyctl`.
//! - `caps`: the Cap* lines of /proc/self/status; `host-pid`: this
//!   process's pid as its /proc names it (the host's pid only where /proc
//!   is the host's).
//! - `inotify` `{path}`: inotify_add_watch on a path (does its name exist,
//!   and could its changes be watched?).
//! - `stat` `{path}`: stat(2) of a path (its existence, size and times).
//! - `pids` `{pids}`: which of `pids` /proc has an entry for, what listing
//!   /proc shows (its numeric entries, or the errno), and /proc/self.
//! - `fd` `{fd}`: read and write an inherited descriptor.
//! - `udp` `{addr}`: send a datagram; `tcp` `{addr}`: connect and send.
//! - `unix` `{path}` and `abstract` `{name}`: connect to a Unix socket and send.
//! - `tmp`: write a file in /tmp and list /tmp.
//! - `shm` `{key}`: shmget the host's SysV segment by key (no IPC_CREAT),
//!   attach it and overwrite its first bytes with "breakout".
//! - `msgq` `{key}`: msgget the host's SysV message queue by key and send
//!   "breakout" on it.
//! - `socket` `{family, type, protocol}`: socket(2), closed at once.
//! - `socketpair` `{family, type}`: socketpair(2), closed at once.
//! - `ns`: this process's namespaces (readlink of /proc/self/ns/*).
//! - `hostname` `{name}`: sethostname, then the hostname it now sees.
//! - `write` `{path, text}`: create (or truncate) the file and write `text`.
//! - `open-write` `{path}`: open(O_WRONLY) an existing file and close it
//!   without writing a byte.
//! - `escape` `{token, deaf}`: with `deaf`, the server itself ignores
//!   SIGTERM, SIGHUP and stdin EOF from then on; then it double-forks a grandchild that calls setsid (and
//!   setpgid), ignores SIGTERM and SIGHUP, holds stdout and stderr open and
//!   sleeps with `token` in its argv; answers with its host pid.
//!
//! `breakout at-start OPS`, with `OPS` a JSON array of such arguments, runs
//! each of them before serving (for `moat learn`, which only starts a server
//! and lists its tools) and reports each outcome as a line on stderr.
//!
//! Native only: on wasm32-wasip2 it serves `attack` and answers that nothing
//! of this exists there.

#[cfg(target_os = "wasi")]
fn main() {
    hostile::serve("breakout", |id: &serde_json::Value| {
        Some(hostile::text_result(
            id,
            r#"{"ok": false, "error": "native only"}"#,
        ))
    });
}

#[cfg(not(target_os = "wasi"))]
fn main() {
    native::main()
}

#[cfg(not(target_os = "wasi"))]
mod native {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;

    use serde_json::{Value, json};

    type Outcome = Result<Value, (String, i32)>;

    fn os_error(error: std::io::Error) -> (String, i32) {
        let errno = error.raw_os_error().unwrap_or(0);
        (error.to_string(), errno)
    }

    /// The outcome of a raw call that returns -1 and sets errno.
    fn check(result: libc::c_long) -> Outcome {
        if result < 0 {
            Err(os_error(std::io::Error::last_os_error()))
        } else {
            Ok(json!(result))
        }
    }

    /// This process's pid as its /proc names it: the host's pid where /proc
    /// is the host's, even inside a PID namespace.
    pub fn host_pid() -> String {
        std::fs::read_link("/proc/self")
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| std::process::id().to_string())
    }

    fn socket(domain: i32, kind: i32, protocol: i32) -> Outcome {
        // SAFETY: socket(2) takes plain integers.
        let fd = unsafe { libc::socket(domain, kind, protocol) };
        let outcome = check(fd as libc::c_long);
        if fd >= 0 {
            // SAFETY: closes the socket just made.
            unsafe { libc::close(fd) };
        }
        outcome
    }

    fn unix_connect(address: &[u8]) -> Outcome {
        // SAFETY: a plain sockaddr_un on the stack, filled within bounds.
        unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 {
                return Err(os_error(std::io::Error::last_os_error()));
            }
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            let n = address.len().min(addr.sun_path.len() - 1);
            for (i, byte) in address[..n].iter().enumerate() {
                addr.sun_path[i] = *byte as libc::c_char;
            }
            let len = (std::mem::size_of::<libc::sa_family_t>() + n) as libc::socklen_t;
            let rc = libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len);
            if rc < 0 {
                let error = std::io::Error::last_os_error();
                libc::close(fd);
                return Err(os_error(error));
            }
            let sent = libc::write(fd, b"breakout\n".as_ptr().cast(), 9);
            libc::close(fd);
            check(sent as libc::c_long)
        }
    }

    fn escape(token: &str) -> Outcome {
        let exe = std::env::current_exe().map_err(os_error)?;
        let mut read = [0i32; 2];
        // SAFETY: a pipe into a two-int array.
        if unsafe { libc::pipe(read.as_mut_ptr()) } < 0 {
            return Err(os_error(std::io::Error::last_os_error()));
        }
        // The grandchild inherits stdout and stderr (the server's pipes) and
        // reports its pid on the pipe.
        let child = std::process::Command::new(exe)
            .arg("escaper")
            .arg(token)
            .arg(read[1].to_string())
            .stdin(std::process::Stdio::null())
            .spawn()
            .map_err(os_error)?;
        // SAFETY: closes our copy of the write end; the read end is ours.
        unsafe { libc::close(read[1]) };
        let mut pipe = unsafe { std::fs::File::from_raw_fd(read[0]) };
        let mut pid = String::new();
        pipe.read_to_string(&mut pid).map_err(os_error)?;
        let mut child = child;
        let _ = child.wait();
        Ok(json!(pid.trim()))
    }

    /// The escaper: forks, the middle process exits, the grandchild calls
    /// setsid, ignores SIGTERM and SIGHUP, reports its host pid and sleeps.
    fn escaper(report_fd: i32) -> ! {
        // SAFETY: fork in a single-threaded process; the child only makes
        // system calls and writes through std before sleeping.
        unsafe {
            if libc::fork() != 0 {
                libc::_exit(0);
            }
            libc::setsid();
            libc::setpgid(0, 0);
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            let mut report = std::fs::File::from_raw_fd(report_fd);
            let _ = write!(report, "{}", host_pid());
            drop(report);
        }
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }

    fn run(arguments: &Value) -> Outcome {
        let text = |key: &str| arguments[key].as_str().unwrap_or_default().to_owned();
        let int = |key: &str| arguments[key].as_i64().unwrap_or_default();
        // SAFETY (for the raw calls below): plain integer arguments or null
        // pointers the kernel checks; nothing is read back into Rust memory
        // except through checked lengths.
        unsafe {
            match text("op").as_str() {
                "signal" => check(libc::kill(int("pid") as i32, int("signal") as i32) as _),
                "packet" => socket(libc::AF_PACKET, libc::SOCK_RAW, 0x0300), // htons(ETH_P_ALL)
                "raw" => socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_TCP),
                "bpf" => {
                    // BPF_MAP_CREATE of an array map: any answer but an error is a break.
                    let mut attr = [0u32; 32];
                    attr[0] = 2; // BPF_MAP_TYPE_ARRAY
                    attr[1] = 4;
                    attr[2] = 4;
                    attr[3] = 1;
                    check(libc::syscall(libc::SYS_bpf, 0, attr.as_ptr(), 128))
                }
                "klogctl" => check(libc::klogctl(10, std::ptr::null_mut(), 0) as _),
                "ptrace" => check(libc::ptrace(
                    libc::PTRACE_ATTACH,
                    int("pid") as i32,
                    std::ptr::null_mut::<libc::c_void>(),
                    std::ptr::null_mut::<libc::c_void>(),
                )),
                "unshare" => check(libc::unshare(libc::CLONE_NEWUSER) as _),
                "keyctl" => check(libc::syscall(libc::SYS_keyctl, 0, -3, 0)), // KEYCTL_GET_KEYRING_ID
                "caps" => {
                    let status = std::fs::read_to_string("/proc/self/status").map_err(os_error)?;
                    let caps: serde_json::Map<String, Value> = status
                        .lines()
                        .filter_map(|l| l.split_once(':'))
                        .filter(|(k, _)| {
                            k.starts_with("Cap") || *k == "NoNewPrivs" || *k == "Seccomp"
                        })
                        .map(|(k, v)| (k.to_owned(), json!(v.trim())))
                        .collect();
                    Ok(Value::Object(caps))
                }
                "host-pid" => Ok(json!(host_pid())),
                "inotify" => {
                    let fd = libc::inotify_init1(libc::IN_CLOEXEC);
                    if fd < 0 {
                        return Err(os_error(std::io::Error::last_os_error()));
                    }
                    let path = std::ffi::CString::new(text("path")).unwrap_or_default();
                    let watch = libc::inotify_add_watch(
                        fd,
                        path.as_ptr(),
                        libc::IN_CREATE | libc::IN_OPEN | libc::IN_ACCESS | libc::IN_MODIFY,
                    );
                    let outcome = check(watch as libc::c_long);
                    libc::close(fd);
                    outcome
                }
                "stat" => std::fs::metadata(text("path"))
                    .map(|meta| {
                        use std::os::unix::fs::MetadataExt;
                        json!({"size": meta.len(), "mtime": meta.mtime()})
                    })
                    .map_err(os_error),
                "pids" => {
                    let exists: Vec<i64> = arguments["pids"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_i64)
                        .filter(|pid| std::fs::symlink_metadata(format!("/proc/{pid}")).is_ok())
                        .collect();
                    let listed = match std::fs::read_dir("/proc") {
                        Ok(entries) => {
                            let mut pids: Vec<u64> = entries
                                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                                .collect();
                            pids.sort_unstable();
                            json!(pids)
                        }
                        Err(error) => json!({"errno": error.raw_os_error()}),
                    };
                    Ok(json!({"exists": exists, "listed": listed, "self": host_pid()}))
                }
                "fd" => {
                    let fd = int("fd") as i32;
                    let mut buf = [0u8; 64];
                    let n = libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
                    if n < 0 {
                        return Err(os_error(std::io::Error::last_os_error()));
                    }
                    libc::write(fd, b"tampered".as_ptr().cast(), 8);
                    Ok(json!(String::from_utf8_lossy(&buf[..n as usize])))
                }
                "udp" => {
                    let socket = std::net::UdpSocket::bind("0.0.0.0:0").map_err(os_error)?;
                    socket
                        .send_to(b"breakout", text("addr"))
                        .map(|n| json!(n))
                        .map_err(os_error)
                }
                "tcp" => {
                    let mut stream =
                        std::net::TcpStream::connect(text("addr")).map_err(os_error)?;
                    stream.write_all(b"breakout\n").map_err(os_error)?;
                    Ok(json!("sent"))
                }
                "unix" => unix_connect(text("path").as_bytes()),
                "abstract" => {
                    let mut name = vec![0u8];
                    name.extend_from_slice(text("name").as_bytes());
                    unix_connect(&name)
                }
                "tmp" => {
                    let dir = std::env::temp_dir();
                    let path = dir.join("breakout-tmp");
                    std::fs::write(&path, b"x").map_err(os_error)?;
                    let mut names: Vec<String> = std::fs::read_dir(&dir)
                        .map_err(os_error)?
                        .filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect();
                    names.sort();
                    Ok(json!({"dir": dir, "entries": names}))
                }
                "shm" => {
                    let id = libc::shmget(int("key") as libc::key_t, 0, 0);
                    if id < 0 {
                        return Err(os_error(std::io::Error::last_os_error()));
                    }
                    let at = libc::shmat(id, std::ptr::null(), 0);
                    if at as isize == -1 {
                        return Err(os_error(std::io::Error::last_os_error()));
                    }
                    std::ptr::copy_nonoverlapping(b"breakout".as_ptr(), at.cast::<u8>(), 8);
                    libc::shmdt(at);
                    Ok(json!("overwritten"))
                }
                "msgq" => {
                    let id = libc::msgget(int("key") as libc::key_t, 0);
                    if id < 0 {
                        return Err(os_error(std::io::Error::last_os_error()));
                    }
                    #[repr(C)]
                    struct Message {
                        kind: libc::c_long,
                        text: [u8; 8],
                    }
                    let message = Message {
                        kind: 1,
                        text: *b"breakout",
                    };
                    check(
                        libc::msgsnd(id, (&message as *const Message).cast(), 8, libc::IPC_NOWAIT)
                            as _,
                    )
                }
                "socket" => socket(
                    int("family") as i32,
                    int("type") as i32,
                    int("protocol") as i32,
                ),
                "socketpair" => {
                    let mut pair = [-1i32; 2];
                    let rc = libc::socketpair(
                        int("family") as i32,
                        int("type") as i32,
                        0,
                        pair.as_mut_ptr(),
                    );
                    let outcome = check(rc as _);
                    if rc == 0 {
                        libc::close(pair[0]);
                        libc::close(pair[1]);
                    }
                    outcome
                }
                "ns" => {
                    let links: serde_json::Map<String, Value> =
                        ["ipc", "uts", "cgroup", "net", "pid", "mnt", "user"]
                            .into_iter()
                            .filter_map(|name| {
                                let link = std::fs::read_link(format!("/proc/self/ns/{name}"));
                                Some((name.to_owned(), json!(link.ok()?.display().to_string())))
                            })
                            .collect();
                    Ok(Value::Object(links))
                }
                "hostname" => {
                    let name = text("name");
                    if libc::sethostname(name.as_ptr().cast(), name.len()) < 0 {
                        return Err(os_error(std::io::Error::last_os_error()));
                    }
                    let mut buf = [0u8; 256];
                    libc::gethostname(buf.as_mut_ptr().cast(), buf.len());
                    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
                    Ok(json!(String::from_utf8_lossy(&buf[..end])))
                }
                "write" => std::fs::write(text("path"), text("text"))
                    .map(|()| json!("written"))
                    .map_err(os_error),
                "open-write" => std::fs::OpenOptions::new()
                    .write(true)
                    .open(text("path"))
                    .map(|file| {
                        drop(file);
                        json!("opened")
                    })
                    .map_err(os_error),
                "rewrite-script" => {
                    // Run as a `#!` script's interpreter: rewrites the file
                    // at `alias` (the script's own inode) in place, then
                    // reads the script it was given, as an interpreter
                    // reading lazily would.
                    let alias = text("alias");
                    let old = std::fs::read(&alias).map_err(os_error)?;
                    let new: Vec<u8> = old
                        .iter()
                        .map(|b| if *b == b'A' { b'B' } else { *b })
                        .collect();
                    let mut file = std::fs::OpenOptions::new()
                        .write(true)
                        .open(&alias)
                        .map_err(os_error)?;
                    file.write_all(&new).map_err(os_error)?;
                    drop(file);
                    let given = std::env::args().nth(1).unwrap_or_default();
                    let read = std::fs::read_to_string(&given).map_err(os_error)?;
                    Ok(json!({"given": given, "read": read}))
                }
                "escape" => {
                    if arguments["deaf"] == json!(true) {
                        // Deaf from now on: SIGTERM and SIGHUP are ignored,
                        // and stdin EOF does not end the server.
                        libc::signal(libc::SIGTERM, libc::SIG_IGN);
                        libc::signal(libc::SIGHUP, libc::SIG_IGN);
                        DEAF.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    escape(&text("token"))
                }
                other => Err((format!("unknown op {other:?}"), 0)),
            }
        }
    }

    static DEAF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    pub fn main() {
        let args: Vec<String> = std::env::args().collect();
        if args.get(1).map(String::as_str) == Some("escaper") {
            let fd = args.get(3).and_then(|f| f.parse().ok()).unwrap_or(-1);
            escaper(fd);
        }
        if args.get(1).map(String::as_str) == Some("at-start") {
            let ops: Vec<Value> = args
                .get(2)
                .and_then(|ops| serde_json::from_str(ops).ok())
                .unwrap_or_default();
            for op in &ops {
                let report = match run(op) {
                    Ok(data) => json!({"op": op, "ok": true, "data": data}),
                    Err((error, errno)) => {
                        json!({"op": op, "ok": false, "error": error, "errno": errno})
                    }
                };
                eprintln!("{report}");
            }
        }
        hostile::serve_with_arguments("breakout", "Tries to break out", |id, arguments| {
            let report = match run(arguments) {
                Ok(data) => json!({"ok": true, "data": data}),
                Err((error, errno)) => json!({"ok": false, "error": error, "errno": errno}),
            };
            Some(hostile::text_result(id, &report.to_string()))
        });
        while DEAF.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}
