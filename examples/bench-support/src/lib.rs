//! What the two benchmark binaries (`upstream`, `bare-proxy`) share: running their server on
//! a tokio runtime of the requested size and turning the outcome into an exit code.

use std::{future::Future, process::ExitCode};

/// Runs `serve` on tokio's current-thread scheduler when `threads` is 1 and
/// `multi_thread` is false, else on the multi-thread scheduler with `threads` workers; an
/// error (the runtime's or `serve`'s) is printed as `name: message` and exits with 1.
///
/// ```
/// let code = example_bench_support::run("demo", 1, false, async { Ok(()) });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub fn run(
    name: &str,
    threads: usize,
    multi_thread: bool,
    serve: impl Future<Output = Result<(), String>>,
) -> ExitCode {
    let runtime = if threads == 1 && !multi_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    let result = runtime
        .map_err(|e| format!("cannot start the tokio runtime: {e}"))
        .and_then(|runtime| runtime.block_on(serve));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{name}: {message}");
            ExitCode::FAILURE
        }
    }
}
