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
//! ## Calls decoded at once (`rmcp` feature)
//!
//! rmcp reads each request as its request types in turn, and a
//! `tools/call` only after thirteen misses, each building an error message
//! (under fuel, in wasm). With the `rmcp` feature (for servers on rmcp
//! 3.11), [`transport`] is rmcp's line transport over the same stdio that
//! decodes a call as a call at once and leaves every other line to rmcp's
//! codec: `.serve(moat_wit::transport())` in place of
//! `.serve(moat_wit::stdio())`. `moat serve` reads its agent the same way
//! (the `moat-lines` crate).
//!
//! ## Idle guests cost nothing
//!
//! When every task is waiting, the runtime's `on_thread_park` hook blocks in
//! `wasi:io/poll` on the pollables of the streams and timers that tasks are
//! waiting on, then wakes exactly those tasks. An idle guest therefore burns no
//! CPU and no fuel; nothing busy-polls.
//!
//! ## Starting from a snapshot
//!
//! Building an rmcp server's routers (every tool's JSON schema) is most of a
//! guest's start. [`preinit!`] exports `wizer-initialize`, which builds that
//! part once; Moat runs it when it compiles the component and snapshots the
//! initialised memory (Wizer's way), so every start begins with it built.
//! [`preinitialized`] then hands it to `main`, or builds it there when the
//! component was not snapshotted (natively, or a server configured with
//! `preinit = false`):
//!
//! ```text
//! moat_wit::preinit!(MyServer::routers);
//!
//! fn main() -> std::io::Result<()> {
//!     let routers = moat_wit::preinitialized(MyServer::routers);
//!     moat_wit::block_on(async { /* MyServer::from(routers).serve(...) */ })
//! }
//! ```
//!
//! What the initialiser builds must not depend on the run-time environment:
//! it runs once, with nothing granted, and every instance starts from what
//! it left. Moat refuses a snapshot whose initialiser asks for arguments,
//! the environment, the working directory, preopened directories or the
//! time (wasi-libc would keep the initialiser's answers for every
//! instance), or returns holding a WASI handle (one `eprintln!` does): read
//! those in `main`. Whatever it draws from `wasi:random` is shared by every
//! instance, so draw secrets in `main` too.
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

/// Exports `wizer-initialize` (on `wasm32-wasip2`; natively nothing), which
/// calls `$make` once and keeps what it returns for [`preinitialized`].
/// `$make` is a path to a function taking nothing, resolved in the module
/// where the macro is invoked; what it returns must be `Send + 'static`.
#[macro_export]
macro_rules! preinit {
    ($make:path) => {
        #[cfg(target_os = "wasi")]
        #[doc(hidden)]
        mod __moat_wit_preinit {
            #[allow(unused_imports)]
            use super::*;
            $crate::__private::wit_bindgen::generate!({
                inline: "package moat:preinit; world preinit { export wizer-initialize: func(); }",
                runtime_path: "::moat_wit::__private::wit_bindgen::rt",
            });
            struct Preinit;
            impl Guest for Preinit {
                fn wizer_initialize() {
                    $crate::__private::keep($make());
                }
            }
            export!(Preinit);
        }
        // Natively there is no snapshot: `$make` is only named, so it
        // counts as used.
        #[cfg(not(target_os = "wasi"))]
        const _: () = {
            let _ = $make;
        };
    };
}

/// What the snapshot's initialiser built (see [`preinit!`]), taken once;
/// else `make()`, run now. A value of another type than `T` is dropped and
/// `make()` runs.
pub fn preinitialized<T: Send + 'static>(make: impl FnOnce() -> T) -> T {
    match __private::take().map(|kept| kept.downcast::<T>()) {
        Some(Ok(kept)) => *kept,
        _ => make(),
    }
}

/// Whether this instance started from a snapshot whose initialiser's value
/// has not been taken yet.
pub fn is_preinitialized() -> bool {
    __private::KEPT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some()
}

#[doc(hidden)]
pub mod __private {
    use std::any::Any;
    use std::sync::Mutex;

    #[cfg(target_os = "wasi")]
    pub use wit_bindgen;

    pub(crate) static KEPT: Mutex<Option<Box<dyn Any + Send>>> = Mutex::new(None);

    /// Keeps what the initialiser built.
    pub fn keep<T: Send + 'static>(value: T) {
        *KEPT.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(value));
    }

    pub(crate) fn take() -> Option<Box<dyn Any + Send>> {
        KEPT.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

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

/// The server's stdin and stdout as rmcp's line transport, with a
/// `tools/call` decoded as a call at once (see the crate's docs).
#[cfg(all(feature = "rmcp", target_os = "wasi"))]
pub fn transport() -> moat_lines::ServerLines<Stdin, Stdout> {
    let (stdin, stdout) = stdio();
    moat_lines::ServerLines::new(stdin, stdout)
}

/// The server's stdin and stdout as rmcp's line transport, with a
/// `tools/call` decoded as a call at once (see the crate's docs).
#[cfg(all(feature = "rmcp", not(target_os = "wasi")))]
pub fn transport() -> moat_lines::ServerLines<tokio::io::Stdin, tokio::io::Stdout> {
    let (stdin, stdout) = stdio();
    moat_lines::ServerLines::new(stdin, stdout)
}

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
