//! The agent's stdio for `moat serve`, on two threads of its own.
//!
//! tokio's stdin and stdout run every read and write on the runtime's
//! blocking pool, which wasm guests share: wasmtime-wasi performs their file
//! operations there, and a guest reading a slow file (a FIFO, a stalled
//! network filesystem) holds a pool thread for as long as it blocks. The
//! agent's session must not queue behind them, so each direction has a
//! dedicated thread and talks to the runtime through a bounded channel.

use std::future::Future;
use std::io::{Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

/// Chunks in flight each way: a slow agent slows the gateway's writes
/// instead of growing a buffer.
const CHUNKS: usize = 16;
/// Bytes read from stdin at a time.
const CHUNK_BYTES: usize = 64 * 1024;

/// Stdin, read on a dedicated thread.
pub struct Stdin {
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
pub struct Stdout {
    chunks: tokio_util::sync::PollSender<Out>,
    flushing: Option<tokio::sync::oneshot::Receiver<()>>,
}

/// The process's stdin and stdout, each on its own thread.
pub fn dedicated() -> (Stdin, Stdout) {
    dedicated_to(std::io::stdin(), std::io::stdout())
}

/// `input` and `output`, each served by a thread of its own.
pub fn dedicated_to(
    mut input: impl Read + Send + 'static,
    mut output: impl Write + Send + 'static,
) -> (Stdin, Stdout) {
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
    (
        Stdin {
            chunks: from_stdin,
            current: Vec::new(),
            offset: 0,
        },
        Stdout {
            chunks: tokio_util::sync::PollSender::new(to_stdout),
            flushing: None,
        },
    )
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
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

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
}
