//! The stdio front of `moat serve`: one agent session on the process's
//! stdin and stdout ([`Agent`]), with 2025-11-25's task requests and
//! declarations rewritten at the wire ([`crate::tasks_2025`]), and the
//! agent's stdio itself, read and written by the runtime where the kernel
//! can say when a descriptor is ready, else on two threads of its own.
//!
//! A pipe or socket (what an agent gives the server it spawns) is polled
//! through the runtime's epoll: a message from the agent wakes the thread
//! that serves it, and an answer leaves from that thread, with no other
//! thread woken on the way. The descriptor is made non-blocking for as long
//! as Moat serves it and restored afterwards. It is polled only when no
//! other of stdin, stdout and stderr is the same pipe or socket, since the
//! flag belongs to the open file that they would share: a log line written
//! to a shared stderr must never meet `EAGAIN`.
//!
//! Anything else (a terminal, a file, `/dev/null`, a shared pipe) gets a
//! dedicated thread per direction that talks to the runtime through a
//! bounded channel. tokio's own stdin and stdout would run every read and
//! write on the runtime's blocking pool, which wasm guests share:
//! wasmtime-wasi performs their file operations there, and a guest reading
//! a slow file (a FIFO, a stalled network filesystem) holds a pool thread
//! for as long as it blocks. Neither way queues the agent behind them.

use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use rustix::fs::{FileType, OFlags};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use crate::gateway::{AgentSession, Gateway};
use crate::session::SessionError;
use crate::tasks_2025::{Reader, Wire, Writer};

/// Why the stdio front could not serve.
#[derive(Debug, thiserror::Error)]
pub enum StdioError {
    #[error("starting the MCP session on stdio")]
    Start(#[source] rmcp::service::ServerInitializeError),
}

/// One agent session of a gateway on the process's stdin and stdout, its
/// handshake done.
pub struct Agent {
    session: AgentSession,
    cancel: rmcp::service::RunningServiceCancellationToken,
    waiting: tokio::task::JoinHandle<Result<rmcp::service::QuitReason, tokio::task::JoinError>>,
}

impl Agent {
    /// Starts `gateway`'s session for the agent on stdio: the handshake
    /// with the agent, served from then on in a task of its own. Must be
    /// called inside the runtime.
    pub async fn start(gateway: &Gateway) -> Result<Self, StdioError> {
        use rmcp::ServiceExt;
        let session = gateway.session();
        // 2025-11-25's task requests and declarations, which rmcp does not
        // carry, rewritten at the wire for an agent on that revision.
        let (input, output) = agent();
        let wire = std::sync::Arc::new(Wire::new(false));
        let service = session
            .clone()
            .serve(moat_lines::ServerLines::new(
                Reader::new(input, wire.clone()),
                Writer::new(output, wire),
            ))
            .await
            .map_err(StdioError::Start)?;
        let cancel = service.cancellation_token();
        let waiting = tokio::spawn(service.waiting());
        Ok(Self {
            session,
            cancel,
            waiting,
        })
    }

    /// Serves the agent until stdin closes (the agent is gone) or
    /// `shutdown` resolves. Then every child is closed, while the agent can
    /// still receive the answers, and the session stops. Returns the
    /// servers that failed to close.
    pub async fn serve_until(
        self,
        shutdown: impl Future<Output = ()>,
    ) -> Vec<(String, SessionError)> {
        let Self {
            session,
            cancel,
            mut waiting,
        } = self;
        let signalled = tokio::select! {
            result = &mut waiting => {
                // stdin EOF (or a broken connection): the agent is gone.
                if let Ok(Err(error)) = result {
                    tracing::warn!(%error, "agent session ended with an error");
                }
                false
            }
            () = shutdown => true,
        };
        // Drain while the agent can still receive the answers, then stop.
        let failures = session.close().await;
        if signalled {
            cancel.cancel();
            let _ = waiting.await;
        }
        failures
    }
}

/// Chunks in flight each way: a slow agent slows the gateway's writes
/// instead of growing a buffer.
const CHUNKS: usize = 16;
/// Bytes read from stdin at a time.
const CHUNK_BYTES: usize = 64 * 1024;

/// Stdin, read on a dedicated thread.
pub(crate) struct Stdin {
    chunks: mpsc::Receiver<std::io::Result<Vec<u8>>>,
    current: Vec<u8>,
    offset: usize,
}

/// What the runtime hands the stdout thread.
enum Out {
    Data(Vec<u8>),
    /// Flush, then answer: a flush returns once the bytes are out.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// Stdout, written on a dedicated thread.
pub(crate) struct Stdout {
    chunks: tokio_util::sync::PollSender<Out>,
    flushing: Option<tokio::sync::oneshot::Receiver<()>>,
}

/// The agent's end of stdin: polled by the runtime, or read on a thread.
pub(crate) enum AgentIn {
    Polled(Polled),
    Thread(Stdin),
}

/// The agent's end of stdout: polled by the runtime, or written on a thread.
pub(crate) enum AgentOut {
    Polled(Polled),
    Thread(Stdout),
}

/// The process's stdin and stdout, each polled by the runtime where that is
/// safe (see the module docs), else served by a thread of its own. Must be
/// called inside the runtime.
pub(crate) fn agent() -> (AgentIn, AgentOut) {
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let input = match polled(
        stdin.as_fd(),
        &[stdout.as_fd(), stderr.as_fd()],
        Interest::READABLE,
    ) {
        Some(polled) => AgentIn::Polled(polled),
        None => AgentIn::Thread(reader_thread(std::io::stdin())),
    };
    let output = match polled(
        stdout.as_fd(),
        &[stdin.as_fd(), stderr.as_fd()],
        Interest::WRITABLE,
    ) {
        Some(polled) => AgentOut::Polled(polled),
        None => AgentOut::Thread(writer_thread(std::io::stdout())),
    };
    (input, output)
}

/// `fd` polled by the runtime for `interest`, when it is a pipe or socket
/// that none of `others` shares, and it can be registered with the
/// runtime's reactor.
pub(crate) fn polled(
    fd: BorrowedFd<'_>,
    others: &[BorrowedFd<'_>],
    interest: Interest,
) -> Option<Polled> {
    let identity = |fd: BorrowedFd<'_>| {
        rustix::fs::fstat(fd).ok().map(|stat| {
            (
                stat.st_dev,
                stat.st_ino,
                FileType::from_raw_mode(stat.st_mode),
            )
        })
    };
    let (dev, ino, kind) = identity(fd)?;
    if !matches!(kind, FileType::Fifo | FileType::Socket) {
        return None;
    }
    if others
        .iter()
        .any(|other| identity(*other).is_none_or(|(d, i, _)| (d, i) == (dev, ino)))
    {
        return None;
    }
    let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
    let restore = rustix::fs::fcntl_getfl(&file).ok()?;
    rustix::fs::fcntl_setfl(&file, restore | OFlags::NONBLOCK).ok()?;
    // SAFETY: `file` owns its descriptor (a duplicate made above), which
    // stays open, and refers to the same open file, until the `AsyncFd` that
    // takes `file` is dropped; `as_raw_fd` on a `File` always returns it.
    match unsafe { AsyncFd::register_with_interest(file, interest) } {
        Ok(fd) => Some(Polled { fd, restore }),
        Err(refused) => {
            let (file, error) = refused.into_parts();
            tracing::debug!(%error, "agent stdio cannot be polled; using a thread");
            let _ = rustix::fs::fcntl_setfl(file, restore);
            None
        }
    }
}

/// A pipe or socket of the agent's, non-blocking while Moat serves it.
pub(crate) struct Polled {
    fd: AsyncFd<std::fs::File>,
    /// The file's flags before Moat made it non-blocking.
    restore: OFlags,
}

impl Drop for Polled {
    fn drop(&mut self) {
        // The open file is the agent's (and outlives Moat): leave it as found.
        let _ = rustix::fs::fcntl_setfl(self.fd.get_ref(), self.restore);
    }
}

impl AsyncRead for Polled {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            let mut ready = std::task::ready!(self.fd.poll_read_ready(cx))?;
            match ready.try_io(|fd| (&mut fd.get_ref()).read(buf.initialize_unfilled())) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(error)) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(Err(error)) => return Poll::Ready(Err(error)),
                // Not ready after all: readiness was cleared, poll again.
                Err(_would_block) => {}
            }
        }
    }
}

impl AsyncWrite for Polled {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        loop {
            let mut ready = std::task::ready!(self.fd.poll_write_ready(cx))?;
            match ready.try_io(|fd| (&mut fd.get_ref()).write(data)) {
                Ok(Err(error)) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => {}
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Written bytes are in the kernel already.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for AgentIn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            AgentIn::Polled(polled) => Pin::new(polled).poll_read(cx, buf),
            AgentIn::Thread(stdin) => Pin::new(stdin).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for AgentOut {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            AgentOut::Polled(polled) => Pin::new(polled).poll_write(cx, data),
            AgentOut::Thread(stdout) => Pin::new(stdout).poll_write(cx, data),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            AgentOut::Polled(polled) => Pin::new(polled).poll_flush(cx),
            AgentOut::Thread(stdout) => Pin::new(stdout).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            AgentOut::Polled(polled) => Pin::new(polled).poll_shutdown(cx),
            AgentOut::Thread(stdout) => Pin::new(stdout).poll_shutdown(cx),
        }
    }
}

/// `input` and `output`, each served by a thread of its own.
#[cfg(test)]
pub(crate) fn dedicated_to(
    input: impl Read + Send + 'static,
    output: impl Write + Send + 'static,
) -> (Stdin, Stdout) {
    (reader_thread(input), writer_thread(output))
}

/// `input`, read on a thread of its own.
fn reader_thread(mut input: impl Read + Send + 'static) -> Stdin {
    let (to_runtime, from_stdin) = mpsc::channel(CHUNKS);
    std::thread::Builder::new()
        .name("moat-stdin".into())
        .spawn(move || {
            let mut buf = vec![0u8; CHUNK_BYTES];
            loop {
                let chunk = match input.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => Ok(buf[..n].to_vec()),
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(error) => Err(error),
                };
                let failed = chunk.is_err();
                if to_runtime.blocking_send(chunk).is_err() || failed {
                    break;
                }
            }
        })
        .expect("spawning the stdin thread");
    Stdin {
        chunks: from_stdin,
        current: Vec::new(),
        offset: 0,
    }
}

/// `output`, written on a thread of its own.
fn writer_thread(mut output: impl Write + Send + 'static) -> Stdout {
    let (to_stdout, from_runtime) = mpsc::channel::<Out>(CHUNKS);
    std::thread::Builder::new()
        .name("moat-stdout".into())
        .spawn(move || {
            let mut from_runtime = from_runtime;
            while let Some(out) = from_runtime.blocking_recv() {
                let written = match out {
                    Out::Data(chunk) => output.write_all(&chunk),
                    Out::Flush(done) => output.flush().map(|()| {
                        let _ = done.send(());
                    }),
                };
                if written.is_err() {
                    break;
                }
            }
        })
        .expect("spawning the stdout thread");
    Stdout {
        chunks: tokio_util::sync::PollSender::new(to_stdout),
        flushing: None,
    }
}

impl AsyncRead for Stdin {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            if self.offset < self.current.len() {
                let n = buf.remaining().min(self.current.len() - self.offset);
                let start = self.offset;
                buf.put_slice(&self.current[start..start + n]);
                self.offset += n;
                return Poll::Ready(Ok(()));
            }
            match self.chunks.poll_recv(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    self.current = chunk;
                    self.offset = 0;
                }
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Err(error)),
                // EOF.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl AsyncWrite for Stdout {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let gone = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        match self.chunks.poll_reserve(cx) {
            Poll::Ready(Ok(())) => match self.chunks.send_item(Out::Data(data.to_vec())) {
                Ok(()) => Poll::Ready(Ok(data.len())),
                Err(_) => Poll::Ready(Err(gone())),
            },
            // The writer thread ended: stdout is gone.
            Poll::Ready(Err(_)) => Poll::Ready(Err(gone())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let gone = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        loop {
            if let Some(done) = &mut self.flushing {
                let flushed = std::task::ready!(Pin::new(done).poll(cx));
                self.flushing = None;
                return Poll::Ready(flushed.map_err(|_| gone()));
            }
            if std::task::ready!(self.chunks.poll_reserve(cx)).is_err() {
                return Poll::Ready(Err(gone()));
            }
            let (done, flushed) = tokio::sync::oneshot::channel();
            self.chunks
                .send_item(Out::Flush(done))
                .map_err(|_| gone())?;
            self.flushing = Some(flushed);
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.poll_flush(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Interest};

    const READ: Interest = Interest::READABLE;
    const WRITE: Interest = Interest::WRITABLE;

    /// With every blocking-pool thread taken (as a guest's stalled file
    /// reads would take them), the agent's lines still go both ways.
    #[test]
    fn the_agent_is_served_while_the_blocking_pool_is_full() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (moat_in, agent_out) = std::io::pipe().unwrap();
        let (agent_in, moat_out) = std::io::pipe().unwrap();
        runtime.block_on(async move {
            let _stuck = tokio::task::spawn_blocking(move || held.recv());
            let (stdin, mut stdout) = super::dedicated_to(moat_in, moat_out);
            let mut agent_out = agent_out;
            std::io::Write::write_all(&mut agent_out, b"ping\n").unwrap();
            let mut line = String::new();
            let mut lines = BufReader::new(stdin);
            tokio::time::timeout(
                std::time::Duration::from_secs(30),
                lines.read_line(&mut line),
            )
            .await
            .expect("stdin is not read through the blocking pool")
            .unwrap();
            assert_eq!(line, "ping\n");
            tokio::time::timeout(std::time::Duration::from_secs(30), async {
                stdout.write_all(b"pong\n").await.unwrap();
                stdout.flush().await.unwrap();
            })
            .await
            .expect("stdout is not written through the blocking pool");
        });
        let mut answer = [0u8; 5];
        std::io::Read::read_exact(&mut { agent_in }, &mut answer).unwrap();
        assert_eq!(&answer, b"pong\n");
        release.send(()).unwrap();
    }

    /// A pipe of the agent's is polled by the runtime, not a thread: lines
    /// go both ways with the blocking pool full and no thread spawned, and
    /// the pipe's flags are restored once Moat is done with it.
    #[test]
    fn an_agent_pipe_is_polled_and_left_as_found() {
        use std::os::fd::AsFd;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (moat_in, agent_out) = std::io::pipe().unwrap();
        let (agent_in, moat_out) = std::io::pipe().unwrap();
        let before = rustix::fs::fcntl_getfl(&moat_in).unwrap();
        assert!(!before.contains(rustix::fs::OFlags::NONBLOCK));
        let (release, held) = std::sync::mpsc::channel::<()>();
        runtime.block_on(async {
            let _stuck = tokio::task::spawn_blocking(move || held.recv());
            let stdin = super::polled(moat_in.as_fd(), &[moat_out.as_fd()], READ)
                .expect("a private pipe is polled");
            let mut stdout = super::polled(moat_out.as_fd(), &[moat_in.as_fd()], WRITE)
                .expect("a private pipe is polled");
            assert!(
                rustix::fs::fcntl_getfl(&moat_in)
                    .unwrap()
                    .contains(rustix::fs::OFlags::NONBLOCK)
            );
            let mut agent_out = agent_out.try_clone().unwrap();
            std::io::Write::write_all(&mut agent_out, b"ping\n").unwrap();
            let mut line = String::new();
            BufReader::new(stdin).read_line(&mut line).await.unwrap();
            assert_eq!(line, "ping\n");
            stdout.write_all(b"pong\n").await.unwrap();
            stdout.flush().await.unwrap();
        });
        let mut answer = [0u8; 5];
        std::io::Read::read_exact(&mut { agent_in }, &mut answer).unwrap();
        assert_eq!(&answer, b"pong\n");
        assert_eq!(
            rustix::fs::fcntl_getfl(&moat_in).unwrap(),
            before,
            "flags restored"
        );
        release.send(()).unwrap();
        drop(agent_out);
    }

    /// What must not be made non-blocking is not polled: a pipe that stderr
    /// shares (a log line would meet EAGAIN), a terminal or a file.
    #[test]
    fn shared_pipes_and_files_are_left_to_threads() {
        use std::os::fd::AsFd;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _inside = runtime.enter();
        let (_reader, writer) = std::io::pipe().unwrap();
        let shared = writer.try_clone().unwrap();
        assert!(super::polled(writer.as_fd(), &[shared.as_fd()], WRITE).is_none());
        assert!(
            !rustix::fs::fcntl_getfl(&writer)
                .unwrap()
                .contains(rustix::fs::OFlags::NONBLOCK)
        );
        let file = tempfile::tempfile().unwrap();
        assert!(super::polled(file.as_fd(), &[], READ).is_none());
        let null = std::fs::File::open("/dev/null").unwrap();
        assert!(super::polled(null.as_fd(), &[], READ).is_none());
    }
}
