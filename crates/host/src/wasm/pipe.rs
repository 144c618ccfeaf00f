//! The in-memory stdio pipes between the host and one wasm instance.
//!
//! One pipe is a bounded byte queue with a writing end and a reading end.
//! The guest's end implements wasmtime-wasi's stream traits directly, and
//! the host's end tokio's `AsyncRead` / `AsyncWrite`, so bytes move between
//! the transport's task and the instance's task with nothing in between.
//! wasmtime-wasi's own adapters (`AsyncStdinStream`, `AsyncStdoutStream`)
//! put a task of their own behind each stream, with a 64 KiB read buffer
//! held while the guest waits for input: a round trip then woke four tasks
//! instead of two, and every idle instance kept that buffer.
//!
//! Bounds: at most `capacity` bytes wait in a pipe. A writer waits (host) or
//! is told there is no room (guest, through `check-write`) until the reader
//! takes some. The queue's allocation grows on demand and is released once
//! it drains, so an idle instance holds no buffer.
//!
//! Ends: every handle of an end shares one token; when the last handle of
//! the writing end drops (or the host shuts it down), the reader sees end
//! of file once the queue is empty; when the last handle of the reading end
//! drops, writes fail (`BrokenPipe` on the host, `closed` in the guest).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use wasmtime_wasi::cli::{IsTerminal, StdinStream, StdoutStream};
use wasmtime_wasi::p2::{InputStream, OutputStream, Pollable, StreamError, StreamResult};

/// A drained queue whose allocation is larger than this is released.
const KEEP_BYTES: usize = 4 * 1024;

/// A bounded in-memory pipe of `capacity` bytes (at least one).
pub fn pipe(capacity: usize) -> (PipeWriter, PipeReader) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            capacity: capacity.max(1),
            writer_gone: false,
            reader_gone: false,
            readers: Vec::new(),
            writers: Vec::new(),
        }),
    });
    (
        PipeWriter {
            end: Arc::new(End {
                shared: shared.clone(),
                writer: true,
            }),
        },
        PipeReader {
            end: Arc::new(End {
                shared,
                writer: false,
            }),
        },
    )
}

struct Shared {
    state: Mutex<State>,
}

struct State {
    queue: VecDeque<u8>,
    capacity: usize,
    /// Every handle of the writing end is gone, or the host shut it down.
    writer_gone: bool,
    /// Every handle of the reading end is gone.
    reader_gone: bool,
    /// Waiting for bytes or the end of the writer.
    readers: Vec<Waker>,
    /// Waiting for room or the end of the reader.
    writers: Vec<Waker>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the queue consistent: every
        // update is a single push or drain.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    fn room(&self) -> usize {
        self.capacity.saturating_sub(self.queue.len())
    }

    /// Moves up to `max` bytes out of the queue, releasing its allocation
    /// once drained; the writers to wake.
    fn take(&mut self, max: usize, into: impl FnOnce(&[u8], &[u8])) -> Vec<Waker> {
        let n = max.min(self.queue.len());
        let (front, back) = self.queue.as_slices();
        let first = n.min(front.len());
        into(&front[..first], &back[..n - first]);
        self.queue.drain(..n);
        if self.queue.is_empty() && self.queue.capacity() > KEEP_BYTES {
            self.queue = VecDeque::new();
        }
        std::mem::take(&mut self.writers)
    }

    /// Appends `bytes` (which fit); the readers to wake.
    fn put(&mut self, bytes: &[u8]) -> Vec<Waker> {
        self.queue.extend(bytes);
        std::mem::take(&mut self.readers)
    }
}

fn register(wakers: &mut Vec<Waker>, cx: &Context<'_>) {
    if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
        wakers.push(cx.waker().clone());
    }
}

fn wake(wakers: Vec<Waker>) {
    wakers.into_iter().for_each(Waker::wake);
}

/// The token every handle of one end shares: its drop ends that end.
struct End {
    shared: Arc<Shared>,
    writer: bool,
}

impl Drop for End {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let woken = if self.writer {
            state.writer_gone = true;
            std::mem::take(&mut state.readers)
        } else {
            state.reader_gone = true;
            // Nobody will read what is queued.
            state.queue = VecDeque::new();
            std::mem::take(&mut state.writers)
        };
        drop(state);
        wake(woken);
    }
}

/// The writing end: the host's side of stdin, the guest's of stdout and
/// stderr. Clones are handles of the same end.
#[derive(Clone)]
pub struct PipeWriter {
    end: Arc<End>,
}

/// The reading end: the guest's side of stdin, the host's of stdout and
/// stderr. Clones are handles of the same end.
#[derive(Clone)]
pub struct PipeReader {
    end: Arc<End>,
}

impl PipeReader {
    fn poll_ready(&self, cx: &Context<'_>) -> Poll<()> {
        let mut state = self.end.shared.lock();
        if !state.queue.is_empty() || state.writer_gone {
            return Poll::Ready(());
        }
        register(&mut state.readers, cx);
        Poll::Pending
    }
}

impl PipeWriter {
    fn poll_ready(&self, cx: &Context<'_>) -> Poll<()> {
        let mut state = self.end.shared.lock();
        if state.room() > 0 || state.reader_gone {
            return Poll::Ready(());
        }
        register(&mut state.writers, cx);
        Poll::Pending
    }
}

impl AsyncRead for PipeReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut state = self.end.shared.lock();
        if state.queue.is_empty() {
            if state.writer_gone {
                return Poll::Ready(Ok(()));
            }
            register(&mut state.readers, cx);
            return Poll::Pending;
        }
        let woken = state.take(buf.remaining(), |a, b| {
            buf.put_slice(a);
            buf.put_slice(b);
        });
        drop(state);
        wake(woken);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for PipeWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let mut state = self.end.shared.lock();
        if state.reader_gone {
            return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        if state.writer_gone {
            return Poll::Ready(Err(std::io::Error::other("write after shutdown")));
        }
        let n = state.room().min(data.len());
        if n == 0 && !data.is_empty() {
            register(&mut state.writers, cx);
            return Poll::Pending;
        }
        let woken = state.put(&data[..n]);
        drop(state);
        wake(woken);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Written bytes are already where the reader takes them.
        Poll::Ready(Ok(()))
    }

    /// Ends the writing end for every handle: the reader sees end of file
    /// once it has taken what is queued.
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let mut state = self.end.shared.lock();
        state.writer_gone = true;
        let woken = std::mem::take(&mut state.readers);
        drop(state);
        wake(woken);
        Poll::Ready(Ok(()))
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for PipeReader {
    async fn ready(&mut self) {
        std::future::poll_fn(|cx| self.poll_ready(cx)).await
    }
}

#[wasmtime_wasi::async_trait]
impl InputStream for PipeReader {
    fn read(&mut self, size: usize) -> StreamResult<Bytes> {
        let mut state = self.end.shared.lock();
        if state.queue.is_empty() {
            return if state.writer_gone {
                Err(StreamError::Closed)
            } else {
                Ok(Bytes::new())
            };
        }
        let mut out = Vec::new();
        let woken = state.take(size, |a, b| {
            out.reserve_exact(a.len() + b.len());
            out.extend_from_slice(a);
            out.extend_from_slice(b);
        });
        drop(state);
        wake(woken);
        Ok(Bytes::from(out))
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for PipeWriter {
    async fn ready(&mut self) {
        std::future::poll_fn(|cx| self.poll_ready(cx)).await
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for PipeWriter {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        let mut state = self.end.shared.lock();
        if state.reader_gone {
            return Err(StreamError::Closed);
        }
        if bytes.len() > state.room() {
            return Err(StreamError::trap("write exceeded the permitted size"));
        }
        let woken = state.put(&bytes);
        drop(state);
        wake(woken);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        // Written bytes are already where the host reads them.
        if self.end.shared.lock().reader_gone {
            return Err(StreamError::Closed);
        }
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        let state = self.end.shared.lock();
        if state.reader_gone {
            return Err(StreamError::Closed);
        }
        Ok(state.room())
    }
}

impl IsTerminal for PipeReader {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl IsTerminal for PipeWriter {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdinStream for PipeReader {
    fn async_stream(&self) -> Box<dyn AsyncRead + Send + Sync> {
        Box::new(self.clone())
    }

    fn p2_stream(&self) -> Box<dyn InputStream> {
        Box::new(self.clone())
    }
}

impl StdoutStream for PipeWriter {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_written_by_the_host_reach_the_guest_and_eof_follows_shutdown() {
        let (mut host, guest) = pipe(16);
        host.write_all(b"hello").await.unwrap();
        let mut stream = guest.p2_stream();
        stream.ready().await;
        assert_eq!(&stream.read(3).unwrap()[..], b"hel");
        assert_eq!(&stream.read(100).unwrap()[..], b"lo");
        assert!(
            stream.read(100).unwrap().is_empty(),
            "nothing queued, writer open"
        );
        host.shutdown().await.unwrap();
        stream.ready().await;
        assert!(matches!(stream.read(1), Err(StreamError::Closed)));
    }

    #[tokio::test]
    async fn a_full_pipe_holds_the_host_writer_until_the_guest_reads() {
        let (mut host, guest) = pipe(4);
        let writer = tokio::spawn(async move {
            host.write_all(b"abcdefgh").await.unwrap();
            host
        });
        let mut stream = guest.p2_stream();
        let mut got = Vec::new();
        while got.len() < 8 {
            stream.ready().await;
            let chunk = stream.read(64).unwrap();
            assert!(chunk.len() <= 4, "at most the capacity is queued");
            got.extend_from_slice(&chunk);
        }
        assert_eq!(got, b"abcdefgh");
        drop(writer.await.unwrap());
        stream.ready().await;
        assert!(matches!(stream.read(1), Err(StreamError::Closed)));
    }

    #[tokio::test]
    async fn the_guest_may_write_only_what_check_write_permits() {
        let (guest, mut host) = pipe(4);
        let mut stream = guest.p2_stream();
        assert_eq!(stream.check_write().unwrap(), 4);
        stream.write(Bytes::from_static(b"abc")).unwrap();
        assert_eq!(stream.check_write().unwrap(), 1);
        let refused = stream.write(Bytes::from_static(b"de")).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("write exceeded the permitted size"),
            "{refused}"
        );
        let mut buf = [0u8; 8];
        assert_eq!(AsyncReadExt::read(&mut host, &mut buf).await.unwrap(), 3);
        assert_eq!(&buf[..3], b"abc");
        assert_eq!(stream.check_write().unwrap(), 4);
    }

    #[tokio::test]
    async fn the_host_sees_eof_once_every_guest_handle_is_gone() {
        let (guest, mut host) = pipe(64);
        let mut first = guest.p2_stream();
        let second = guest.p2_stream();
        first.write(Bytes::from_static(b"tail")).unwrap();
        drop(guest);
        drop(first);
        let mut buf = [0u8; 8];
        assert_eq!(
            AsyncReadExt::read(&mut host, &mut buf).await.unwrap(),
            4,
            "queued bytes still arrive"
        );
        let pending = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            AsyncReadExt::read(&mut host, &mut buf).await.unwrap()
        });
        drop(second);
        assert_eq!(
            pending.await.unwrap(),
            0,
            "end of file after the last handle"
        );
    }

    #[tokio::test]
    async fn writes_fail_once_the_reader_is_gone() {
        let (mut host, guest) = pipe(64);
        drop(guest);
        let error = host.write_all(b"x").await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::BrokenPipe);
        let (guest, host) = pipe(64);
        let mut stream = guest.p2_stream();
        drop(host);
        assert!(matches!(stream.check_write(), Err(StreamError::Closed)));
        stream.ready().await;
        assert!(matches!(
            stream.write(Bytes::from_static(b"x")),
            Err(StreamError::Closed)
        ));
    }

    #[tokio::test]
    async fn a_drained_pipe_releases_its_buffer() {
        let (mut host, guest) = pipe(256 * 1024);
        host.write_all(&[7u8; 100 * 1024]).await.unwrap();
        let mut stream = guest.p2_stream();
        let mut total = 0;
        while total < 100 * 1024 {
            total += stream.read(64 * 1024).unwrap().len();
        }
        let state = guest.end.shared.lock();
        assert_eq!(state.queue.capacity(), 0);
    }
}
