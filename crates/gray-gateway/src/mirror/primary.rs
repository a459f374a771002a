//! The user's side of a copied request: the proxy holds the copy while baseline serves
//! the user, and hands it to the copies' thread with what the copy is to be compared
//! with, once the user's answer has a head.
//!
//! - The copy goes when the user's answer's head arrives ([`Primary::answered`]). Most
//!   answers bring their whole body with the head (a small JSON answer in one read): the
//!   copy then goes with the whole answer, in one hand-over, and nothing of the body is
//!   teed. Otherwise it goes with a channel, and the body is teed as it streams to the
//!   user ([`AnswerTee`]); the answer goes down the channel when the body ends.
//! - A request that gets no answer from an instance (the gateway's own 502, 503, 504; a
//!   client gone) drops its [`Primary`]: the copy goes all the same, to be sent and left
//!   unjudged.
//!
//! Sent once the user's answer has a head, a copy never races its request to the lane
//! (the shadow sees a request after baseline has begun answering it), and the users'
//! thread hands each copy over once: one push onto the copies' queue, and no channel for
//! the common answer.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tokio::{sync::oneshot, time::Instant};

use super::{Catch, Copy, Mirror, compare::Answer, copy::Job};

/// A copied request, while baseline serves it: the copy, until the user's answer has a
/// head. Boxed in the proxy's future (rare, and larger than the future's other fields).
#[derive(Debug)]
pub(crate) struct Primary {
    /// `None` once handed over.
    pending: Option<Pending>,
    /// When the request was routed.
    started: Instant,
}

/// A copy not yet handed over.
#[derive(Debug)]
struct Pending {
    mirror: Arc<Mirror>,
    copy: Copy,
    /// Whether it has a control (the same request to a second baseline instance).
    control: bool,
}

/// The user's answer, as its copy gets it.
#[derive(Debug)]
pub(super) struct UserAnswer {
    pub(super) answer: Answer,
    /// From routing to the response head.
    pub(super) latency: Duration,
}

/// What a copy's task gets of the user's answer.
#[derive(Debug)]
pub(super) enum User {
    /// All of it.
    Answered(UserAnswer),
    /// Its head arrived, its body is on its way: the answer comes down this channel when
    /// it ends (its sender dropped: it did not end).
    Later(oneshot::Receiver<UserAnswer>),
    /// None: the gateway answered, or the request failed.
    Unanswered,
}

/// A response body's tee for the comparison (in [`HeldBody`](crate::hold::HeldBody)).
#[derive(Debug)]
pub(crate) struct AnswerTee {
    head: Option<(StatusCode, HeaderMap, Duration)>,
    catch: Catch,
    to: Option<oneshot::Sender<UserAnswer>>,
}

// === impl Primary ===

impl Primary {
    /// `copy` of a request of `mirror`, with a control when `control`, held from now.
    pub(super) fn new(mirror: Arc<Mirror>, copy: Copy, control: bool) -> Box<Primary> {
        Box::new(Primary {
            pending: Some(Pending {
                mirror,
                copy,
                control,
            }),
            started: Instant::now(),
        })
    }

    /// The user's answer's head arrived, with `whole` its whole body when it came with it:
    /// the copy goes to the copies' thread, with the answer when it is whole; otherwise
    /// the returned tee gives it the answer when its body ends.
    pub(crate) fn answered(
        mut self: Box<Self>,
        status: StatusCode,
        headers: &HeaderMap,
        whole: Option<&Bytes>,
    ) -> Option<Box<AnswerTee>> {
        let pending = self.pending.take()?;
        let latency = self.started.elapsed();
        let cap = pending.mirror.config.max_compare_bytes;
        let head = (status, headers.clone(), latency);
        match whole {
            Some(body) => {
                let mut catch = Catch::new(cap);
                catch.feed(body);
                pending.hand_over(User::Answered(answer(head, &mut catch)));
                None
            }
            None => {
                let (to, from) = oneshot::channel();
                pending.hand_over(User::Later(from));
                Some(Box::new(AnswerTee {
                    head: Some(head),
                    catch: Catch::new(cap),
                    to: Some(to),
                }))
            }
        }
    }
}

impl Drop for Primary {
    /// Not answered by an instance: the copy goes all the same, unjudged.
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            pending.hand_over(User::Unanswered);
        }
    }
}

impl Pending {
    fn hand_over(self, user: User) {
        let Pending {
            mirror,
            copy,
            control,
        } = self;
        let thread = mirror.copies.clone();
        thread.hand_over(Job {
            mirror,
            copy,
            control,
            user,
        });
    }
}

/// The user's answer of `head` and what `catch` holds.
fn answer(head: (StatusCode, HeaderMap, Duration), catch: &mut Catch) -> UserAnswer {
    let (status, headers, latency) = head;
    UserAnswer {
        answer: Answer {
            status,
            headers,
            body: catch.whole(),
        },
        latency,
    }
}

// === impl AnswerTee ===

impl AnswerTee {
    /// A chunk of the body went to the user.
    pub(crate) fn feed(&mut self, data: &Bytes) {
        self.catch.feed(data);
    }

    /// The body ended: the copy's task gets the answer (its sender's send wakes the task
    /// only if it already waits for it: the copy's own answer came first).
    pub(crate) fn end(&mut self) {
        if let (Some(to), Some(head)) = (self.to.take(), self.head.take()) {
            let _ = to.send(answer(head, &mut self.catch));
        }
    }
}
