//! The measured executable: opened without following links, a `#!`
//! script read once into a sealed copy with its interpreter opened the same
//! way, hashed through the descriptor that will run. The `measure` paths
//! are [`paths`]'.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use sha2::{Digest as _, Sha256};

use super::NativeError;
use crate::identity::{Digest, Expectation};
use crate::script::{resolve_interpreter, shebang};

mod paths;

pub(super) use paths::measure_all;
pub use paths::measure_path;

/// The executable, opened without following links, with its digest when
/// one is pinned.
pub struct MeasuredExecutable {
    pub(super) fd: OwnedFd,
    pub(super) digest: Option<Digest>,
    pub(super) interpreter: Option<Interpreter>,
    /// A script's bytes, copied into a memfd as they were read (and hashed)
    /// and sealed against any change: what its interpreter reads.
    pub(super) copy: Option<OwnedFd>,
}

/// A script's interpreter, from its `#!` line: resolved when the script was
/// opened, opened itself without following links, measured with it, and
/// executed through its own descriptor. The kernel never looks the `#!`
/// line up again, so neither the script nor its interpreter can be swapped
/// between the measurement and the exec.
pub struct Interpreter {
    pub(super) fd: OwnedFd,
    /// The file that runs, every link resolved.
    pub path: PathBuf,
    /// Its argv[0]: the path as the `#!` line names it, as the kernel
    /// passes it (a virtualenv's Python finds its `pyvenv.cfg` beside
    /// that path, not beside the file it links to); for `#!/usr/bin/env`,
    /// the resolved file.
    pub argv0: String,
    /// Arguments from the `#!` line, before the script.
    pub args: Vec<String>,
    /// Its digest, when the launch is measured.
    pub digest: Option<Digest>,
}

impl MeasuredExecutable {
    /// The files this launch measures in its identity itself: `script`
    /// (the resolved executable) and its interpreter, if any.
    pub(super) fn measured_files(&self, script: &Path) -> Vec<PathBuf> {
        std::iter::once(script.to_owned())
            .chain(self.interpreter.as_ref().map(|i| i.path.clone()))
            .collect()
    }

    /// The digest of the bytes behind the descriptor, if measured.
    pub fn digest(&self) -> Option<Digest> {
        self.digest
    }

    /// The interpreter, when the executable is a `#!` script.
    pub fn interpreter(&self) -> Option<&Interpreter> {
        self.interpreter.as_ref()
    }
}

/// Resolves, opens and (for a measured launch) hashes the interpreter the
/// script at `path` names (see [`resolve_interpreter`]).
fn open_interpreter(
    path: &Path,
    interpreter: &str,
    argument: Option<String>,
    measure: Option<Option<&crate::seal::Sealer>>,
) -> Result<Interpreter, NativeError> {
    let script = |detail: String| NativeError::Script {
        path: path.to_owned(),
        detail,
    };
    let (target, args, is_env) = resolve_interpreter(path, interpreter, argument)?;
    let fd = rustix::fs::open(
        &target,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| NativeError::Io {
        syscall: "open(O_NOFOLLOW) of the #! interpreter",
        path: target.clone(),
        source: errno.into(),
    })?;
    if let Some((nested, argument)) = shebang(&fd, &target)? {
        let nested = match argument {
            Some(argument) => format!("{nested} {argument}"),
            None => nested,
        };
        return Err(script(format!(
            "its interpreter {} is itself a script (#!{nested}): Moat runs one level of #! only; point the #! line, or `command`, at the real interpreter (under pyenv: `pyenv which python3`)",
            target.display()
        )));
    }
    let digest = match measure {
        Some(sealer) => Some(hash_fd(&fd, &target, sealer)?),
        None => None,
    };
    let argv0 = if is_env {
        target.to_string_lossy().into_owned()
    } else {
        interpreter.to_owned()
    };
    Ok(Interpreter {
        fd,
        argv0,
        path: target,
        args,
        digest,
    })
}

/// Opens `path` with O_NOFOLLOW and, when a digest is pinned, hashes it
/// through that descriptor and checks it. An unpinned launch is not hashed
/// (its evidence is `native-unmeasured`). A `#!` script is copied into a
/// sealed memfd as it is hashed (see [`sealed_copy`]); its interpreter is
/// resolved from the copy's `#!` line.
pub fn open_measured(
    path: &Path,
    expected: Expectation,
    sealer: Option<&crate::seal::Sealer>,
) -> Result<MeasuredExecutable, NativeError> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| {
        if errno == rustix::io::Errno::LOOP {
            NativeError::Symlink {
                path: path.to_owned(),
            }
        } else {
            NativeError::Io {
                syscall: "open(O_NOFOLLOW)",
                path: path.to_owned(),
                source: errno.into(),
            }
        }
    })?;
    let stat = rustix::fs::fstat(&fd).map_err(|errno| NativeError::Io {
        syscall: "fstat",
        path: path.to_owned(),
        source: errno.into(),
    })?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(NativeError::NotRegular {
            path: path.to_owned(),
        });
    }
    let mut head = [0u8; 2];
    let read = rustix::io::pread(&fd, &mut head, 0).map_err(|errno| NativeError::Io {
        syscall: "pread",
        path: path.to_owned(),
        source: errno.into(),
    })?;
    let measured = !matches!(expected, Expectation::Unpinned);
    if &head[..read] == b"#!" {
        // A script is read once, into a sealed copy, hashing as it goes:
        // its #! line, its digest and what its interpreter reads are all
        // those same bytes, whatever happens to the file afterwards.
        let (copy, digest) = sealed_copy(&fd, path, measured)?;
        let Some((interpreter, argument)) = shebang(&copy, path)? else {
            return Err(NativeError::Script {
                path: path.to_owned(),
                detail: "its #! line changed while it was read".to_owned(),
            });
        };
        let interpreter =
            open_interpreter(path, &interpreter, argument, measured.then_some(sealer))?;
        if let Some(actual) = digest {
            expected
                .check(actual)
                .map_err(|mismatch| NativeError::Digest {
                    path: path.to_owned(),
                    mismatch,
                })?;
        }
        return Ok(MeasuredExecutable {
            fd,
            digest,
            interpreter: Some(interpreter),
            copy: Some(copy),
        });
    }
    let digest = if measured {
        // Read through a duplicate so the descriptor we execute stays put.
        let actual = hash_fd(&fd, path, sealer)?;
        expected
            .check(actual)
            .map_err(|mismatch| NativeError::Digest {
                path: path.to_owned(),
                mismatch,
            })?;
        Some(actual)
    } else {
        None
    };
    Ok(MeasuredExecutable {
        fd,
        digest,
        interpreter: None,
        copy: None,
    })
}

/// Copies the file behind `fd` (at `path`) into a new memfd, hashing the
/// bytes as they are copied when `hash`, then seals the copy against
/// writing, growing, shrinking and further sealing (runc's answer to
/// CVE-2019-5736): the digest is of exactly the bytes the copy holds, and
/// they can no longer change. Returns the copy, at offset 0, and the digest.
fn sealed_copy(
    fd: &OwnedFd,
    path: &Path,
    hash: bool,
) -> Result<(OwnedFd, Option<Digest>), NativeError> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let io = |syscall: &'static str| {
        move |errno: rustix::io::Errno| NativeError::Io {
            syscall,
            path: path.to_owned(),
            source: errno.into(),
        }
    };
    let copy = rustix::fs::memfd_create(
        "moat-script",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .map_err(io("memfd_create"))?;
    let mut hasher = hash.then(Sha256::new);
    let mut buf = vec![0u8; 1 << 16];
    let mut offset = 0u64;
    loop {
        let n = match rustix::io::pread(fd, &mut buf, offset) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(errno) => return Err(io("pread")(errno)),
        };
        if n == 0 {
            break;
        }
        if let Some(hasher) = &mut hasher {
            hasher.update(&buf[..n]);
        }
        let mut written = 0;
        while written < n {
            match rustix::io::write(&copy, &buf[written..n]) {
                Ok(w) => written += w,
                Err(rustix::io::Errno::INTR) => {}
                Err(errno) => return Err(io("write to the memfd")(errno)),
            }
        }
        offset += n as u64;
    }
    rustix::fs::fcntl_add_seals(
        &copy,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )
    .map_err(io("fcntl(F_ADD_SEALS)"))?;
    rustix::fs::seek(&copy, rustix::fs::SeekFrom::Start(0)).map_err(io("lseek"))?;
    Ok((
        copy,
        hasher.map(|h| Digest::from_bytes(h.finalize().into())),
    ))
}

/// The digest of the file behind `fd` (at `path`): from its seal when it
/// is unchanged since it was hashed, else read through a duplicate (so the
/// descriptor to execute keeps its offset) and hashed.
fn hash_fd(
    fd: &OwnedFd,
    path: &Path,
    sealer: Option<&crate::seal::Sealer>,
) -> Result<Digest, NativeError> {
    let io = |syscall: &'static str| {
        move |source| NativeError::Io {
            syscall,
            path: path.to_owned(),
            source,
        }
    };
    let file = std::fs::File::from(fd.try_clone().map_err(io("dup"))?);
    let Some(sealer) = sealer else {
        return hash_reader(file, path);
    };
    let meta = file.metadata().map_err(io("fstat"))?;
    let (digest, source) = sealer.digest(path, &meta, || hash_reader(&file, path))?;
    tracing::trace!(path = %path.display(), ?source, "executable digest");
    Ok(digest)
}

pub(super) fn hash_reader(mut reader: impl Read, path: &Path) -> Result<Digest, NativeError> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buf).map_err(|source| NativeError::Io {
            syscall: "read",
            path: path.to_owned(),
            source,
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(Digest::from_bytes(hasher.finalize().into()))
}
