//! What the benchmarks share: an endpoint that answers at once, and streams of them.

use std::{
    convert::Infallible,
    future::{Ready, ready},
    sync::Arc,
    task::{Context, Poll},
};

use gray_core::{Labelled, Labels};
use tower::{Service, discover::Change};

pub(crate) type Req = http::Request<()>;

/// An endpoint that answers at once; its clone is a reference count increment.
#[derive(Clone)]
pub(crate) struct Endpoint(pub(crate) Arc<Labels>);

impl Labelled for Endpoint {
    fn labels(&self) -> &Labels {
        &self.0
    }
}

impl Service<Req> for Endpoint {
    type Response = ();
    type Error = Infallible;
    type Future = Ready<Result<(), Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        ready(Ok(()))
    }
}

/// Endpoint `i`, gray when `i` is a multiple of `gray_every` (never when it is 0).
pub(crate) fn endpoint(i: usize, gray_every: usize) -> Endpoint {
    let labels = if gray_every > 0 && i.is_multiple_of(gray_every) {
        Labels::from_iter([("gray", "true")])
    } else {
        Labels::new()
    };
    Endpoint(Arc::new(labels))
}

/// `n` endpoints, inserted at once.
pub(crate) fn endpoints(
    n: usize,
    gray_every: usize,
) -> impl futures_util::Stream<Item = Result<Change<usize, Endpoint>, Infallible>> + Unpin {
    futures_util::stream::iter((0..n).map(move |i| Ok(Change::Insert(i, endpoint(i, gray_every)))))
}
