//! [`ClientAborted`]: a request body that failed where it came from (the client went
//! away mid-upload, reset its stream, or stopped sending), so that nobody downstream
//! mistakes the client's doing for the instance's.
//!
//! A proxy streams a client's body to an instance. When the client abandons the upload,
//! the upstream send fails too, and its error, walked down its source chain, looks like a
//! broken connection to the instance (an `io::Error` of kind `ConnectionReset`, an
//! incomplete message). A balancer counting connection errors would then eject a healthy
//! instance because its clients give up. Wrap the request body's own errors in a
//! `ClientAborted` (gray-gateway does, for every proxied body): gray-balance's `classify`
//! finds it anywhere in the chain and answers `Failure::Client`, which counts against no
//! instance, and the gateway logs and counts it as a client abort (nginx's 499).
//!
//! `ClientAborted` is transparent: it displays as the error it wraps, and its
//! [`source`](std::error::Error::source) is that error.
//!
//! ```
//! use std::{error::Error, io};
//! use gray_core::aborted::ClientAborted;
//!
//! let reset = io::Error::from(io::ErrorKind::ConnectionReset);
//! let error: Box<dyn Error + Send + Sync> = Box::new(ClientAborted::new(reset));
//! assert_eq!(error.to_string(), "connection reset");
//! assert!(ClientAborted::find(&*error).is_some());
//! assert!(ClientAborted::find(&io::Error::from(io::ErrorKind::ConnectionReset)).is_none());
//! ```

use std::{error::Error, fmt};

/// A request body's error from its source (the client); see the [module docs](self).
pub struct ClientAborted {
    error: Box<dyn Error + Send + Sync>,
}

impl ClientAborted {
    /// `error`, which the request's body met where it came from.
    pub fn new(error: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        ClientAborted {
            error: error.into(),
        }
    }

    /// The body's error.
    #[must_use]
    pub fn get_ref(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The first `ClientAborted` in `error`'s source chain, `error` included.
    #[must_use]
    pub fn find<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a ClientAborted> {
        crate::unsent::find_in_chain(error)
    }
}

impl fmt::Debug for ClientAborted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ClientAborted").field(&self.error).finish()
    }
}

impl fmt::Display for ClientAborted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl Error for ClientAborted {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.error)
    }
}
