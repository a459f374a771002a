//! [`StaticDiscover`]: a fixed list of instances.
//!
//! The stream yields one `Insert` per instance (in id order; a repeated id keeps the last
//! one) and then ends, like [`tower::discover::ServiceList`]; a balancer keeps serving the
//! instances it has when its discover stream ends.
//!
//! For a fixed list that several balancers share, and that an admin view reads, use
//! [`Registry::from_static`](crate::Registry::from_static).
//!
//! ```
//! use futures_util::StreamExt;
//! use gray_core::Labels;
//! use gray_discovery::{Instance, StaticDiscover};
//! use tower::discover::Change;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let mut discover = StaticDiscover::new([
//!     Instance::new("a".parse()?, "127.0.0.1:8081".parse()?, Labels::new()),
//!     Instance::new("b".parse()?, "127.0.0.1:8082".parse()?, Labels::from_iter([("gray", "true")])),
//! ]);
//! let mut ids = Vec::new();
//! while let Some(change) = discover.next().await {
//!     if let Change::Insert(id, _) = change? {
//!         ids.push(id.to_string());
//!     }
//! }
//! assert_eq!(ids, ["a", "b"]);
//! # Ok::<(), gray_discovery::Error>(())
//! # }).unwrap();
//! ```

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use futures_core::Stream;
use tower::discover::Change;

use crate::{Error, Instance, InstanceId, InstanceSet};

/// A discover stream over a fixed list of instances; see the [module docs](self).
#[derive(Debug)]
pub struct StaticDiscover {
    changes: std::vec::IntoIter<Change<InstanceId, Instance>>,
}

impl StaticDiscover {
    /// The instances of one service.
    pub fn new(instances: impl IntoIterator<Item = Instance>) -> Self {
        StaticDiscover {
            changes: InstanceSet::new().replace(instances).into_iter(),
        }
    }
}

impl Stream for StaticDiscover {
    type Item = Result<Change<InstanceId, Instance>, Error>;

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.changes.next().map(Ok))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.changes.size_hint()
    }
}
