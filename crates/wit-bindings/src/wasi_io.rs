//! The `wasi:io/poll` reactor behind [`crate::block_on`], and the stdin,
//! stdout and timer futures that register with it.
//!
//! A future that cannot make progress registers the pollable it waits on
//! together with its waker. When tokio has no runnable work it calls
//! [`park`], which blocks in one `wasi:io/poll.poll` over every registered
//! pollable and wakes all registered tasks once any is ready; each re-checks
//! its stream and registers again if it still has to wait. Nothing spins.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use wasip2::clocks::monotonic_clock;
use wasip2::io::poll::{Pollable, poll};
use wasip2::io::streams::{InputStream, OutputStream, StreamError};

thread_local! {
    /// Pollables that parked tasks wait on, with the wakers to call.
    static WAITING: RefCell<Vec<(Pollable, Waker)>> = const { RefCell::new(Vec::new()) };
}

fn register(pollable: Pollable, waker: &Waker) {
    WAITING.with(|waiting| waiting.borrow_mut().push((pollable, waker.clone())));
}

/// The runtime's `on_thread_park` hook: block until a registered pollable is
/// ready, then wake every registered task.
///
/// With nothing registered it returns at once and tokio parks on its own
/// (sleeping until its next timer, if it has one).
pub(crate) fn park() {
    let waiting = WAITING.with(|waiting| std::mem::take(&mut *waiting.borrow_mut()));
    if waiting.is_empty() {
        return;
    }
    let pollables: Vec<&Pollable> = waiting.iter().map(|(pollable, _)| pollable).collect();
    // Blocks in the host until at least one is ready.
    let _ready = poll(&pollables);
    drop(pollables);
    for (_, waker) in waiting {
        waker.wake();
    }
}

fn stream_error(operation: &str, error: StreamError) -> io::Error {
    match error {
        StreamError::Closed => io::Error::new(
            io::ErrorKind::BrokenPipe,
            format!("{operation}: stream closed"),
        ),
        StreamError::LastOperationFailed(error) => {
            io::Error::other(format!("{operation}: {}", error.to_debug_string()))
        }
    }
}

/// `wasi:cli/stdin` as a tokio [`AsyncRead`]. End of stream reads as EOF.
pub struct Stdin {
    stream: InputStream,
    eof: bool,
}

impl Stdin {
    pub(crate) fn new() -> Self {
        Self {
            stream: wasip2::cli::stdin::get_stdin(),
            eof: false,
        }
    }
}

impl AsyncRead for Stdin {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.eof || buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        match self.stream.read(buf.remaining() as u64) {
            Ok(bytes) if bytes.is_empty() => {
                register(self.stream.subscribe(), cx.waker());
                Poll::Pending
            }
            Ok(bytes) => {
                buf.put_slice(&bytes);
                Poll::Ready(Ok(()))
            }
            Err(StreamError::Closed) => {
                self.eof = true;
                Poll::Ready(Ok(()))
            }
            Err(error) => Poll::Ready(Err(stream_error("reading stdin", error))),
        }
    }
}

/// `wasi:cli/stdout` as a tokio [`AsyncWrite`].
pub struct Stdout {
    stream: OutputStream,
    flushing: bool,
}

impl Stdout {
    pub(crate) fn new() -> Self {
        Self {
            stream: wasip2::cli::stdout::get_stdout(),
            flushing: false,
        }
    }
}

impl AsyncWrite for Stdout {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        match self.stream.check_write() {
            Ok(0) => {
                register(self.stream.subscribe(), cx.waker());
                Poll::Pending
            }
            Ok(permitted) => {
                let n = buf
                    .len()
                    .min(usize::try_from(permitted).unwrap_or(usize::MAX));
                match self.stream.write(&buf[..n]) {
                    Ok(()) => Poll::Ready(Ok(n)),
                    Err(error) => Poll::Ready(Err(stream_error("writing stdout", error))),
                }
            }
            Err(error) => Poll::Ready(Err(stream_error("writing stdout", error))),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.flushing {
            if let Err(error) = self.stream.flush() {
                return Poll::Ready(Err(stream_error("flushing stdout", error)));
            }
            self.flushing = true;
        }
        // check-write answers 0 until the flush has completed.
        match self.stream.check_write() {
            Ok(0) => {
                register(self.stream.subscribe(), cx.waker());
                Poll::Pending
            }
            Ok(_) => {
                self.flushing = false;
                Poll::Ready(Ok(()))
            }
            Err(error) => {
                self.flushing = false;
                Poll::Ready(Err(stream_error("flushing stdout", error)))
            }
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

/// A timer on `wasi:clocks/monotonic-clock`.
pub(crate) struct Sleep {
    deadline: monotonic_clock::Instant,
}

impl Sleep {
    pub(crate) fn new(duration: Duration) -> Self {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Self {
            deadline: monotonic_clock::now().saturating_add(nanos),
        }
    }
}

impl std::future::Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if monotonic_clock::now() >= self.deadline {
            return Poll::Ready(());
        }
        register(
            monotonic_clock::subscribe_instant(self.deadline),
            cx.waker(),
        );
        Poll::Pending
    }
}
