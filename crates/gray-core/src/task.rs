//! The task-local stain, and the carriers that take it across task boundaries (cargo
//! feature `task`).
//!
//! gray-tower's `ExtractStain` sets the stain for the whole handling of a request: the
//! synchronous `call()` and every poll of the response future. Code running there reads it
//! with [`current`]; gray-tower's `PropagateStain` and gray-balance's balancer read it for
//! outbound requests. It lives here, at the bottom of the workspace, so that every crate can
//! read it without depending on the layer crate (as tower-service and tower-layer sit below
//! tower).
//!
//! A tokio task-local lives in one task. It does **not** reach:
//!
//! | where | why | what to use |
//! |---|---|---|
//! | `tokio::spawn(fut)` | a new task | [`spawn`], or `tokio::spawn(fut.in_current_stain())` ([`StainExt`]) |
//! | `tokio::task::spawn_blocking(f)` | a pool thread | [`spawn_blocking`] |
//! | a service behind `tower::buffer::Buffer` (tonic's `Channel` is one) | the inner `call()` runs in the buffer's worker task | put gray-tower's `PropagateStain` outside the `Buffer`, or its `CaptureStain` outside it so inner layers read the request extensions |
//! | `std::thread::spawn` | a plain thread | capture with [`current`], then [`sync_scope`] inside the thread |
//! | `JoinSet::spawn`, `LocalSet::spawn_local` | new tasks | wrap the future with [`StainExt::in_current_stain`] |
//!
//! ```
//! use gray_core::{Stain, Lane};
//! use gray_core::task::{self, StainExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let stain = Stain::in_lane(Lane::new("gray").unwrap());
//! async {
//!     // A bare tokio::spawn loses the stain...
//!     let lost = tokio::spawn(async { task::current() }).await.unwrap();
//!     assert_eq!(lost, None);
//!     // ...the carriers keep it.
//!     let kept = task::spawn(async { task::current() }).await.unwrap();
//!     assert_eq!(kept.unwrap().lane().unwrap(), "gray");
//!     let kept = task::spawn_blocking(task::current).await.unwrap();
//!     assert_eq!(kept.unwrap().lane().unwrap(), "gray");
//! }
//! .with_stain(stain)
//! .await;
//! # }
//! ```

use std::{
    borrow::Cow,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use crate::Stain;
use pin_project_lite::pin_project;
use tokio::task::{JoinHandle, futures::TaskLocalFuture};

tokio::task_local! {
    static CURRENT: Stain;
}

/// The stain of the current task, if one was set.
///
/// Cloning a stain costs at most two `Arc` increments.
pub fn current() -> Option<Stain> {
    CURRENT.try_with(Stain::clone).ok()
}

/// `stain` when there is one (the request's own, from its extensions), else the stain of
/// the current task: where every layer and balancer looks for the stain of a request.
/// Borrows the request's stain; clones the task-local one (at most a few `Arc` increments).
///
/// ```
/// use gray_core::{Lane, Stain, task};
///
/// let gray = Stain::in_lane(Lane::new("gray").unwrap());
/// let blue = Stain::in_lane(Lane::new("blue").unwrap());
/// task::sync_scope(blue.clone(), || {
///     assert_eq!(task::or_current(Some(&gray)).as_deref(), Some(&gray));
///     assert_eq!(task::or_current(None).as_deref(), Some(&blue));
/// });
/// assert_eq!(task::or_current(None), None);
/// ```
pub fn or_current(stain: Option<&Stain>) -> Option<Cow<'_, Stain>> {
    match stain {
        Some(stain) => Some(Cow::Borrowed(stain)),
        None => current().map(Cow::Owned),
    }
}

/// Runs `fut` with `stain` as the current stain.
pub fn scope<F: Future>(stain: Stain, fut: F) -> TaskLocalFuture<Stain, F> {
    CURRENT.scope(stain, fut)
}

/// Runs the closure `f` with `stain` as the current stain (for synchronous code and
/// plain threads).
pub fn sync_scope<R>(stain: Stain, f: impl FnOnce() -> R) -> R {
    CURRENT.sync_scope(stain, f)
}

/// `tokio::spawn`, carrying the current stain into the new task.
pub fn spawn<F>(fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(fut.in_current_stain())
}

/// `tokio::task::spawn_blocking`, carrying the current stain to the blocking thread.
pub fn spawn_blocking<F, R>(f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    match current() {
        Some(stain) => tokio::task::spawn_blocking(move || sync_scope(stain, f)),
        None => tokio::task::spawn_blocking(f),
    }
}

/// Attaches a stain to any future, so that it travels into `spawn`, `JoinSet`, a
/// `select!` arm or a stream combinator.
pub trait StainExt: Future + Sized {
    /// Runs this future with `stain` as its current stain.
    fn with_stain(self, stain: Stain) -> WithStain<Self> {
        WithStain {
            inner: Inner::Scoped {
                fut: CURRENT.scope(stain, self),
            },
        }
    }

    /// Runs this future with the stain that is current *now*, when this is called
    /// (or without one, if none is set).
    fn in_current_stain(self) -> WithStain<Self> {
        match current() {
            Some(stain) => self.with_stain(stain),
            None => WithStain {
                inner: Inner::Bare { fut: self },
            },
        }
    }
}

impl<F: Future> StainExt for F {}

pin_project! {
    /// A future that runs with a captured stain; see [`StainExt`].
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct WithStain<F: Future> {
        #[pin]
        inner: Inner<F>,
    }
}

pin_project! {
    #[project = InnerProj]
    #[derive(Debug)]
    enum Inner<F: Future> {
        Scoped { #[pin] fut: TaskLocalFuture<Stain, F> },
        Bare { #[pin] fut: F },
    }
}

impl<F: Future> Future for WithStain<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().inner.project() {
            InnerProj::Scoped { fut } => fut.poll(cx),
            InnerProj::Bare { fut } => fut.poll(cx),
        }
    }
}

// === the stain of an outbound request ===

/// What [`outbound`] records in a request's extensions when it found no stain anywhere,
/// so that a later layer or middleware of the same request finds none either.
#[derive(Debug, Clone, Copy)]
struct NoStain;

/// The stain an outbound request is sent with, found the same way by every client-side
/// layer and middleware of gray (gray-tower's `PropagateStain` and reqwest
/// `PropagateMiddleware`, gray-balance's reqwest `RouteMiddleware`), in this order:
///
/// 1. the request's own [`Stain`] extension;
/// 2. the task-local stain ([`current`]);
/// 3. with the feature `opentelemetry`, the lane in the current OpenTelemetry baggage under
///    the member key of `carriers`' first `baggage` carrier (`gray.lane` without one)
///    ([`baggage_stain`]).
///
/// A stain found only in OpenTelemetry's baggage is recorded in `extensions` (and so is
/// finding none there), so that whichever of the middlewares of one request runs first
/// decides for all of them: their order in a reqwest client does not matter, and a
/// balancer below a propagating layer routes by the stain that layer wrote. Cloning a
/// stain is a few `Arc` increments; nothing is allocated for a stain in the extensions or
/// the task-local.
///
/// ```
/// use gray_core::{Carriers, Lane, Stain, task};
/// use http::Extensions;
///
/// let carriers = Carriers::default();
/// let gray = Stain::in_lane(Lane::new("gray").unwrap());
/// let mut extensions = Extensions::new();
/// assert_eq!(task::outbound(&mut extensions, &carriers), None);
/// task::sync_scope(gray.clone(), || {
///     assert_eq!(task::outbound(&mut Extensions::new(), &carriers), Some(gray.clone()));
/// });
/// extensions.insert(gray.clone());
/// assert_eq!(task::outbound(&mut extensions, &carriers), Some(gray));
/// ```
pub fn outbound(extensions: &mut http::Extensions, carriers: &crate::Carriers) -> Option<Stain> {
    if let Some(stain) = extensions.get::<Stain>() {
        return Some(stain.clone());
    }
    if let Some(stain) = current() {
        return Some(stain);
    }
    if extensions.get::<NoStain>().is_some() {
        return None;
    }
    match baggage_stain(carriers) {
        Some(stain) => {
            extensions.insert(stain.clone());
            Some(stain)
        }
        None => {
            if cfg!(feature = "opentelemetry") {
                extensions.insert(NoStain);
            }
            None
        }
    }
}

/// The lane in the current OpenTelemetry baggage (feature `opentelemetry`), under the member
/// key of `carriers`' first `baggage` carrier (`gray.lane` without one), as a stain: lowercased
/// and interned by the carriers' names like any other lane. An invalid one is ignored with a
/// debug event (target `gray::otel`). Always `None` without the feature.
#[must_use]
pub fn baggage_stain(carriers: &crate::Carriers) -> Option<Stain> {
    #[cfg(feature = "opentelemetry")]
    {
        use opentelemetry::{Context, baggage::BaggageExt};

        let key = carriers.baggage().map_or(
            crate::codec::DEFAULT_BAGGAGE_KEY,
            crate::codec::BaggageMember::key,
        );
        Context::map_current(|cx| {
            let value = cx.baggage().get(key)?;
            match carriers.names().lane(value.as_str().as_bytes()) {
                Ok(lane) => Some(Stain::in_lane(lane)),
                Err(error) => {
                    tracing::debug!(
                        target: "gray::otel",
                        key,
                        %error,
                        "lane in the OpenTelemetry baggage ignored",
                    );
                    None
                }
            }
        })
    }
    #[cfg(not(feature = "opentelemetry"))]
    {
        let _ = carriers;
        None
    }
}

#[cfg(test)]
mod tests {
    use crate::Lane;

    use super::*;

    fn gray() -> Stain {
        Stain::in_lane(Lane::new("gray").unwrap())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn carriers_keep_the_stain_and_bare_spawn_does_not() {
        async {
            assert_eq!(current(), Some(gray()));
            assert_eq!(tokio::spawn(async { current() }).await.unwrap(), None);
            assert_eq!(tokio::task::spawn_blocking(current).await.unwrap(), None);
            assert_eq!(spawn(async { current() }).await.unwrap(), Some(gray()));
            assert_eq!(spawn_blocking(current).await.unwrap(), Some(gray()));
            let thread_ctx = current();
            let from_thread = std::thread::spawn(move || match thread_ctx {
                Some(stain) => sync_scope(stain, current),
                None => None,
            })
            .join()
            .unwrap();
            assert_eq!(from_thread, Some(gray()));
        }
        .with_stain(gray())
        .await;
        assert_eq!(current(), None);
        assert_eq!(async { current() }.in_current_stain().await, None);
    }

    #[cfg(feature = "opentelemetry")]
    #[test]
    fn outbound_records_what_it_found_in_the_otel_baggage() {
        use opentelemetry::{Context, KeyValue, baggage::BaggageExt};

        let carriers = crate::Carriers::default();
        let mut extensions = http::Extensions::new();
        {
            let _in_gray =
                Context::current_with_baggage([KeyValue::new("gray.lane", "Gray")]).attach();
            assert_eq!(outbound(&mut extensions, &carriers), Some(gray()));
        }
        // Recorded: the next middleware of the request finds it without the context.
        assert_eq!(extensions.get::<Stain>(), Some(&gray()));
        assert_eq!(outbound(&mut extensions, &carriers), Some(gray()));

        // Nothing found is recorded too: a later lane in the context changes nothing.
        let mut extensions = http::Extensions::new();
        assert_eq!(outbound(&mut extensions, &carriers), None);
        let _in_gray = Context::current_with_baggage([KeyValue::new("gray.lane", "gray")]).attach();
        assert_eq!(outbound(&mut extensions, &carriers), None);
        assert_eq!(
            outbound(&mut http::Extensions::new(), &carriers),
            Some(gray())
        );
    }
}
