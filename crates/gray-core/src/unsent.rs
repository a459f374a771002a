//! [`Unsent`]: the error of an endpoint that could not send a request at all (its
//! connection was refused, or could not be made), with the request handed back.
//!
//! A request that never left can go to another instance, whatever its method: nothing
//! reached the instance. An endpoint that still holds such a request returns it inside an
//! `Unsent`, and a retrying balancer (gray-balance's `retry::Retry`) takes it back and
//! sends it elsewhere, body and all, without having kept a copy of every request in case
//! one fails. gray-discovery's HTTP endpoints do this; an endpoint that drops the request
//! (tonic's `Channel` connects in the request's future and drops a request it could not
//! send) is retried only from a copy the balancer kept.
//!
//! `Unsent` is transparent: it displays as the error it wraps, and its
//! [`source`](std::error::Error::source) is that error, so a walk of the source chain
//! finds the endpoint's own error type (and the `io::Error` under it) as before.
//!
//! ```
//! use std::{error::Error, io};
//! use gray_core::unsent::Unsent;
//!
//! let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
//! let error: Box<dyn Error + Send + Sync> =
//!     Box::new(Unsent::new(http::Request::new("body"), refused));
//! assert_eq!(error.to_string(), "connection refused");
//!
//! // Found anywhere in the chain, and taken back once, as the type it was given as.
//! let unsent = Unsent::find(&*error).unwrap();
//! assert!(unsent.take::<String>().is_none(), "not a String");
//! let request = unsent.take::<http::Request<&str>>().unwrap();
//! assert_eq!(*request.body(), "body");
//! assert!(unsent.take::<http::Request<&str>>().is_none(), "taken already");
//! ```

use std::{
    any::Any,
    error::Error,
    fmt,
    sync::{Mutex, PoisonError},
};

/// The error of an endpoint that did not send a request, with the request; see the
/// [module docs](self).
pub struct Unsent {
    request: Mutex<Option<Box<dyn Any + Send>>>,
    error: Box<dyn Error + Send + Sync>,
}

impl Unsent {
    /// `error`, which kept `request` from being sent at all (nothing of it reached the
    /// instance).
    pub fn new<R: Send + 'static>(
        request: R,
        error: impl Into<Box<dyn Error + Send + Sync>>,
    ) -> Self {
        Unsent {
            request: Mutex::new(Some(Box::new(request))),
            error: error.into(),
        }
    }

    /// The request, if it is an `R` and nobody took it yet.
    pub fn take<R: 'static>(&self) -> Option<R> {
        let mut slot = self.request.lock().unwrap_or_else(PoisonError::into_inner);
        let request = slot.take()?;
        match request.downcast::<R>() {
            Ok(request) => Some(*request),
            Err(other) => {
                *slot = Some(other);
                None
            }
        }
    }

    /// The error that kept the request from being sent.
    pub fn get_ref(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The first `Unsent` in `error`'s source chain, `error` included.
    pub fn find<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a Unsent> {
        find_in_chain(error)
    }
}

impl fmt::Debug for Unsent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unsent")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Unsent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl Error for Unsent {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.error)
    }
}

/// The first `T` in `error`'s source chain, `error` included: how [`Unsent::find`] and
/// [`ClientAborted::find`](crate::aborted::ClientAborted::find) look.
pub(crate) fn find_in_chain<'a, T: Error + 'static>(
    error: &'a (dyn Error + 'static),
) -> Option<&'a T> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_below_other_errors_and_sent_once() {
        #[derive(Debug)]
        struct Outer(Unsent);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "outer")
            }
        }
        impl Error for Outer {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        let outer = Outer(Unsent::new(7_u32, "no route"));
        let unsent = Unsent::find(&outer).expect("in the chain");
        assert_eq!(unsent.to_string(), "no route");
        assert_eq!(unsent.get_ref().to_string(), "no route");
        assert_eq!(unsent.take::<u32>(), Some(7));
        assert_eq!(unsent.take::<u32>(), None);
        assert!(Unsent::find(&std::io::Error::other("x")).is_none());
    }
}
