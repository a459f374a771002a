//! The copies' thread: every mirror's copies (their tasks, their connections, their
//! timers) run on a runtime of their own, on one thread at the lowest scheduling priority
//! (nice 19: under Linux's scheduler it gets about 1.5 % of a core that a normal thread
//! wants). The users' requests and the copies then never share a scheduler queue, and
//! when the machine's CPU is all taken, the kernel gives it to everything else first: the
//! copies fall behind, fill `max_in_flight`, and the next ones are dropped and counted
//! (`dropped_busy`) instead of slowing anyone. `mirror_priority = "normal"` keeps the
//! gateway's priority instead, for a host with CPU to spare.

use std::{future::Future, io};

use tokio::{runtime::Handle, sync::oneshot};

use crate::config::MirrorPriority;

/// The nice value of the copies' thread: the lowest priority.
const NICE: i32 = 19;

/// The copies' runtime; its thread ends when this is dropped.
#[derive(Debug)]
pub(crate) struct Copies {
    handle: Handle,
    _stop: oneshot::Sender<()>,
}

impl Copies {
    /// Starts the copies' thread, at `priority`.
    pub(crate) fn start(priority: MirrorPriority) -> io::Result<Copies> {
        let (handle_to, handle) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("gray-mirror".into())
            .spawn(move || {
                // Best effort: without the right, the thread keeps the default priority.
                if priority == MirrorPriority::Low
                    && let Err(e) =
                        rustix::process::setpriority_process(Some(rustix::thread::gettid()), NICE)
                {
                    tracing::debug!(error = %e, "cannot lower the copies' thread's priority");
                }
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = handle_to.send(Err(e));
                        return;
                    }
                };
                let _ = handle_to.send(Ok(runtime.handle().clone()));
                // Until the gateway lets go: then its copies are dropped with it.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        let handle = handle.recv().map_err(|_| {
            io::Error::other("the copies' thread ended before its runtime started")
        })??;
        Ok(Copies {
            handle,
            _stop: stop,
        })
    }

    /// Runs `copy` on the copies' thread.
    pub(crate) fn spawn<F>(&self, copy: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.handle.spawn(copy);
    }
}
