//! The copies' thread: every mirror's copies (their tasks, their connections, their
//! timers) run on a runtime of their own, on one thread at the lowest scheduling priority
//! (nice 19: under Linux's scheduler it gets about 1.5 % of a core that a normal thread
//! wants). The users' requests and the copies then never share a scheduler queue, and
//! when the machine's CPU is all taken, the kernel gives it to everything else first: the
//! copies fall behind, fill `max_in_flight`, and the next ones are dropped and counted
//! (`dropped_busy`) instead of slowing anyone. `mirror_priority = "normal"` keeps the
//! gateway's priority instead, for a host with CPU to spare.
//!
//! **The hand-over.** The users' thread hands each copy over once
//! ([`primary`](super::primary)), through a queue that a dispatcher task on the copies'
//! thread empties: it starts each copy's task there (the task is made and allocated on
//! that thread, not on the users'). Waking another thread's runtime is a system call
//! (tokio writes to its event fd): through the queue, the users' thread wakes the copies'
//! thread only when the dispatcher waits for work, once for every batch it then takes.
//! Under load that is a small fraction of the copies (spawning each copy's task from the
//! users' thread woke it for every copy); an idle gateway's single copy wakes it once.
//!
//! The queue holds at most one job a copy in flight, and copies in flight are bounded by
//! each mirror's `max_in_flight` (a copy holds its place from the moment it is offered):
//! it needs no bound of its own, and a send never waits.

use std::{io, sync::Arc};

use tokio::sync::{mpsc, oneshot};

use gray_tower::mirror::Shed;

use super::copy::{self, Job};
use crate::config::MirrorPriority;

/// The nice value of the copies' thread: the lowest priority.
const NICE: i32 = 19;

/// The copies' thread; it ends when this is dropped (and the copies in flight, which hold
/// it through their mirror, have ended).
#[derive(Debug)]
pub(crate) struct CopyThread {
    jobs: mpsc::UnboundedSender<Job>,
    /// On while the users' runtime is too busy for copies.
    pub(super) shed: Shed,
    /// Held while this lives: the sampler of `shed` stops when it is gone.
    _alive: Arc<()>,
    _stop: oneshot::Sender<()>,
}

impl CopyThread {
    /// Starts the copies' thread, at `priority`; copies are shed while the current
    /// runtime's threads (the users') want the CPU more than `max_busy` of their time
    /// ([`shed`](super::shed)).
    pub(crate) fn start(priority: MirrorPriority, max_busy: f64) -> io::Result<CopyThread> {
        let (started_to, started) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let (jobs, queue) = mpsc::unbounded_channel();

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
                        let _ = started_to.send(Err(e));
                        return;
                    }
                };
                let _ = started_to.send(Ok(()));
                // Until the gateway lets go: then its copies are dropped with it.
                runtime.block_on(async {
                    tokio::select! {
                        _ = stopped => {}
                        () = dispatch(queue) => {}
                    }
                });
            })?;
        started.recv().map_err(|_| {
            io::Error::other("the copies' thread ended before its runtime started")
        })??;
        let (shed, alive) = (Shed::new(), Arc::new(()));
        super::shed::when_busy(shed.clone(), max_busy, Arc::downgrade(&alive));
        Ok(CopyThread {
            jobs,
            shed,
            _alive: alive,
            _stop: stop,
        })
    }

    /// Hands `job` to the copies' thread. Never waits; a job for a thread that has ended
    /// is dropped (a copy's place with it).
    pub(super) fn hand_over(&self, job: Job) {
        let _ = self.jobs.send(job);
    }
}

/// The dispatcher: takes every copy queued, each time it is woken, and starts its task,
/// on the copies' thread.
async fn dispatch(mut queue: mpsc::UnboundedReceiver<Job>) {
    while let Some(job) = queue.recv().await {
        tokio::spawn(copy::run(job));
    }
}
