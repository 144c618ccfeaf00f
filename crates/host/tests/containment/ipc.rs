//! The hostile server against the host's SysV IPC, hostname and cgroup:
//! all out of reach.

use super::*;

/// A SysV shared memory segment and message queue of the host (this test
/// process), made with known keys and mode 0666, removed when dropped.
struct HostIpc {
    key: libc::key_t,
    shm: i32,
    memory: *mut u8,
    msq: i32,
}

impl HostIpc {
    const CONTENT: &[u8; 16] = b"the host's bytes";

    fn new(salt: i32) -> Self {
        let key = 0x4d00_0000 | ((std::process::id() as i32 & 0xffff) << 4) | salt;
        let create = libc::IPC_CREAT | libc::IPC_EXCL | 0o666;
        // SAFETY: SysV calls on plain integers; the segment is attached at a
        // place the kernel picks and written within its 4096 bytes.
        unsafe {
            let shm = libc::shmget(key, 4096, create);
            assert!(shm >= 0, "shmget: {}", std::io::Error::last_os_error());
            let memory = libc::shmat(shm, std::ptr::null(), 0).cast::<u8>();
            assert_ne!(memory as isize, -1, "shmat");
            std::ptr::copy_nonoverlapping(Self::CONTENT.as_ptr(), memory, Self::CONTENT.len());
            let msq = libc::msgget(key, create);
            assert!(msq >= 0, "msgget: {}", std::io::Error::last_os_error());
            Self {
                key,
                shm,
                memory,
                msq,
            }
        }
    }

    /// What a process of the host's IPC namespace finds by the key: the
    /// same objects (what the server would reach without a namespace).
    fn reachable_by_key(&self) -> bool {
        // SAFETY: lookups by key, no memory touched.
        unsafe { libc::shmget(self.key, 0, 0) == self.shm && libc::msgget(self.key, 0) == self.msq }
    }

    fn content(&self) -> Vec<u8> {
        // SAFETY: reads 16 bytes of the attached 4096-byte segment.
        unsafe { std::slice::from_raw_parts(self.memory, Self::CONTENT.len()).to_vec() }
    }

    fn messages_queued(&self) -> u64 {
        // SAFETY: IPC_STAT into a zeroed msqid_ds on the stack.
        unsafe {
            let mut stat: libc::msqid_ds = std::mem::zeroed();
            assert_eq!(libc::msgctl(self.msq, libc::IPC_STAT, &mut stat), 0);
            stat.msg_qnum as u64
        }
    }
}

impl Drop for HostIpc {
    fn drop(&mut self) {
        // SAFETY: detaches and removes the objects this test made.
        unsafe {
            libc::shmdt(self.memory.cast());
            libc::shmctl(self.shm, libc::IPC_RMID, std::ptr::null_mut());
            libc::msgctl(self.msq, libc::IPC_RMID, std::ptr::null_mut());
        }
    }
}

#[tokio::test]
async fn the_hosts_sysv_ipc_hostname_and_cgroup_are_out_of_reach() {
    let neighbour = Neighbour::start().await;
    let ipc = HostIpc::new(1);
    assert!(ipc.reachable_by_key(), "the host's objects exist by key");
    let server = host().connect(&breakout()).await.unwrap();
    for op in ["shm", "msgq"] {
        let report = attack(&server, json!({"op": op, "key": ipc.key})).await;
        refused(&report, libc::ENOENT, op);
        neighbour.answers().await;
    }
    assert_eq!(
        ipc.content(),
        HostIpc::CONTENT,
        "the host's segment changed"
    );
    assert_eq!(
        ipc.messages_queued(),
        0,
        "a message reached the host's queue"
    );
    // Its own IPC, UTS and cgroup namespaces.
    let ns = attack(&server, json!({"op": "ns"})).await;
    for name in ["ipc", "uts", "cgroup"] {
        let ours = std::fs::read_link(format!("/proc/self/ns/{name}")).unwrap();
        let theirs = ns["data"][name].as_str().expect("the server's namespace");
        assert_ne!(theirs, ours.display().to_string(), "{name}: {ns}");
    }
    // No capability to set even its own hostname; the host's is untouched.
    let before = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let renamed = attack(&server, json!({"op": "hostname", "name": "breakout"})).await;
    refused(&renamed, libc::EPERM, "sethostname");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        before
    );
    server.close().await.unwrap();
    neighbour.close().await;
}
