//! moat-wit: what a Moat guest links.
//!
//! This crate owns the guest side of Moat's stdio boundary: an
//! `AsyncRead`/`AsyncWrite` pair over `wasi:cli` stdin and stdout, and a tokio
//! current-thread runtime that parks in `wasi:io/poll`. With it an ordinary
//! [rmcp](https://docs.rs/rmcp) server compiles to `wasm32-wasip2` and runs
//! under `moat` unchanged, apart from one place in `main`.
//!
//! # For guest authors
//!
//! rmcp's `transport::stdio()` and `#[tokio::main]` do not work on
//! `wasm32-wasip2`: tokio's stdin/stdout need blocking threads, and a stock
//! runtime has nothing to block in when it is idle. Replace them with
//! [`block_on`] and [`stdio`]; the same source then builds natively too, where
//! these two forward to tokio's own runtime and stdio:
//!
//! ```text
//! fn main() -> std::io::Result<()> {
//!     moat_wit::block_on(async {
//!         let service = MyServer::new()
//!             .serve(moat_wit::stdio())
//!             .await
//!             .map_err(std::io::Error::other)?;
//!         service.waiting().await.map_err(std::io::Error::other)?;
//!         Ok(())
//!     })
//! }
//! ```
//!
//! ## Idle guests cost nothing
//!
//! When every task is waiting, the runtime's `on_thread_park` hook blocks in
//! `wasi:io/poll` on the pollables of the streams and timers that tasks are
//! waiting on, then wakes exactly those tasks. An idle guest therefore burns no
//! CPU and no fuel; nothing busy-polls.
//!
//! ## Timers
//!
//! Use [`time::sleep`] for delays in guest code. tokio's own timers work (rmcp
//! uses them internally), but the park hook cannot see their deadlines: a
//! `tokio::time::sleep` only completes once the guest next wakes for I/O or a
//! [`time::sleep`] timer. On native builds [`time::sleep`] is
//! `tokio::time::sleep`.

#[cfg(target_os = "wasi")]
mod wasi_io;

use std::future::Future;

/// Runs `future` to completion on a current-thread tokio runtime suited to the
/// target: on `wasm32-wasip2` one whose park hook blocks in `wasi:io/poll`;
/// natively a plain current-thread runtime with timers.
///
/// # Panics
///
/// Panics if the runtime cannot be built, which only happens when the
/// platform refuses the resources a current-thread runtime needs.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time();
    #[cfg(target_os = "wasi")]
    builder.on_thread_park(wasi_io::park);
    let runtime = builder
        .build()
        .expect("building a current-thread tokio runtime");
    runtime.block_on(future)
}

/// The server's stdin and stdout as an `(AsyncRead, AsyncWrite)` pair, which
/// rmcp accepts as a transport.
#[cfg(target_os = "wasi")]
pub fn stdio() -> (Stdin, Stdout) {
    (Stdin::new(), Stdout::new())
}

/// The server's stdin and stdout as an `(AsyncRead, AsyncWrite)` pair, which
/// rmcp accepts as a transport.
#[cfg(not(target_os = "wasi"))]
pub fn stdio() -> (tokio::io::Stdin, tokio::io::Stdout) {
    (tokio::io::stdin(), tokio::io::stdout())
}

#[cfg(target_os = "wasi")]
pub use wasi_io::{Stdin, Stdout};

/// Timers that wake the guest from its park in `wasi:io/poll`.
pub mod time {
    use std::time::Duration;

    /// Waits for `duration`. On `wasm32-wasip2` this registers a
    /// `wasi:clocks/monotonic-clock` pollable with the park hook, so an idle
    /// guest wakes exactly when the timer is due.
    #[cfg(target_os = "wasi")]
    pub async fn sleep(duration: Duration) {
        super::wasi_io::Sleep::new(duration).await
    }

    /// Waits for `duration` (natively: `tokio::time::sleep`).
    #[cfg(not(target_os = "wasi"))]
    pub async fn sleep(duration: Duration) {
        tokio::time::sleep(duration).await
    }
}
