//! What an endpoint's error says about where the request failed: [`Failure`], and the
//! default [`classify`].

use std::{error::Error, io};

use gray_core::{aborted::ClientAborted, unsent::Unsent};

/// Where a request failed, as its error tells: whether anything of it may have reached
/// the instance. A [`Classifier`] decides it; the balancer's passive health, its probes
/// and [retries](crate::retry) act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// The instance refused the connection: nothing listens there, and nothing was sent.
    /// The endpoint leaves the picks at once (see [`Ejection`](super::Ejection)).
    Refused,
    /// No connection could be made (a connect error other than a refusal, a failed
    /// handshake), or the endpoint handed the request back unsent
    /// ([`Unsent`]): nothing was sent.
    Unsent,
    /// The connection broke (reset, aborted, closed early) before a response head
    /// arrived: the request may have reached the instance.
    Broken,
    /// The instance stopped answering at all: an HTTP/2 keep-alive PING went unanswered
    /// for its timeout, and the connection was closed. Out of the picks at once, like a
    /// refusal (a black-holed host keeps its connection open and answers nothing), but
    /// the request may have reached it: retried only as a broken one is.
    Unresponsive,
    /// Anything else: the instance answered, or the error says nothing about the
    /// connection (a timeout, a protocol error).
    Other,
    /// The request's own body failed where it came from ([`ClientAborted`]: the client
    /// went away mid-upload, or reset its stream): the client's doing, counted against no
    /// instance and never retried.
    Client,
}

impl Failure {
    /// `true` for a connection error (refused, unsent, broken or unresponsive): what
    /// passive health counts towards an ejection.
    #[must_use]
    pub fn is_connection(self) -> bool {
        !matches!(self, Failure::Other | Failure::Client)
    }

    /// `true` when nothing of the request reached the instance (refused or unsent): it
    /// may go to another instance whatever its method.
    #[must_use]
    pub fn nothing_sent(self) -> bool {
        matches!(self, Failure::Refused | Failure::Unsent)
    }

    /// `true` when the endpoint leaves the picks at once (refused, unresponsive), not
    /// after consecutive failures.
    #[must_use]
    pub fn ejects_at_once(self) -> bool {
        matches!(self, Failure::Refused | Failure::Unresponsive)
    }

    /// The name of this failure in logs and metrics: `refused`, `unsent`, `broken`,
    /// `unresponsive`, `other`, `client`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Refused => "refused",
            Failure::Unsent => "unsent",
            Failure::Broken => "broken",
            Failure::Unresponsive => "unresponsive",
            Failure::Other => "other",
            Failure::Client => "client",
        }
    }
}

/// Decides what an endpoint's error says; [`classify`] by default.
pub type Classifier = fn(&(dyn Error + 'static)) -> Failure;

/// The default [`Classifier`]. It walks the error's `source()` chain:
///
/// - an [`io::Error`] of kind `ConnectionRefused`: [`Failure::Refused`];
/// - an [`Unsent`] (an endpoint that handed the request back), an `io::Error` of kind
///   `AddrNotAvailable`, `HostUnreachable` or `NetworkUnreachable`, or (feature
///   `hyper-util`) a hyper-util client error whose `is_connect()` is true, or an HTTP/2
///   stream the instance refused (`REFUSED_STREAM`) or left above the last stream of a
///   graceful `GOAWAY` (`NO_ERROR`: a server shutting down), which it never processed:
///   [`Failure::Unsent`];
/// - an `io::Error` of kind `ConnectionReset`, `ConnectionAborted`, `BrokenPipe`,
///   `NotConnected` or `UnexpectedEof`, or (feature `hyper-util`) a hyper error that
///   `is_incomplete_message()` (the connection closed before the response) or
///   `is_canceled()` (it closed with the request queued on it), or (feature
///   `rustls`) a `rustls::Error`, bare or inside an `io::Error` (how tokio-rustls reports
///   a failed handshake: an unknown CA, a wrong name, an expired or refused certificate):
///   [`Failure::Broken`]; (feature `hyper-util`) a hyper error that `is_timeout()` (on a
///   client connection, only an HTTP/2 keep-alive PING left unanswered for its timeout):
///   [`Failure::Unresponsive`]. A TLS error alone does not tell whether the handshake or a
///   later record failed, so it counts towards an ejection but lets only an idempotent
///   request go elsewhere; clients that know the handshake failed say so (gray-discovery's
///   endpoints hand the request back [`Unsent`], hyper-util's connect errors are
///   `is_connect`), and then any request may;
/// - anything else: [`Failure::Other`].
///
/// A [`ClientAborted`] anywhere in the chain wins over all of these: the request's own
/// body failed at the client, and whatever the upstream connection then reported follows
/// from it ([`Failure::Client`]). Otherwise a refusal anywhere wins, then an unanswered
/// PING; an error that says both "not connected" and "broken" (a reset during a TLS
/// handshake) is unsent.
pub fn classify(error: &(dyn Error + 'static)) -> Failure {
    if ClientAborted::find(error).is_some() {
        return Failure::Client;
    }
    let mut unsent = false;
    let mut broken = false;
    // Only hyper's errors say a PING went unanswered (feature `hyper-util`).
    #[cfg_attr(not(feature = "hyper-util"), allow(unused_mut))]
    let mut unresponsive = false;
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            match io.kind() {
                io::ErrorKind::ConnectionRefused => return Failure::Refused,
                io::ErrorKind::AddrNotAvailable
                | io::ErrorKind::HostUnreachable
                | io::ErrorKind::NetworkUnreachable => unsent = true,
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::NotConnected
                | io::ErrorKind::UnexpectedEof => broken = true,
                _ => {}
            }
        } else if e.is::<Unsent>() {
            unsent = true;
        }
        #[cfg(feature = "rustls")]
        {
            let inner = e
                .downcast_ref::<io::Error>()
                .and_then(io::Error::get_ref)
                .map(|inner| -> &(dyn Error + 'static) { inner });
            broken |= e.is::<rustls::Error>() || inner.is_some_and(|i| i.is::<rustls::Error>());
        }
        #[cfg(feature = "hyper-util")]
        {
            if let Some(client) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
                unsent |= client.is_connect();
            }
            if let Some(hyper) = e.downcast_ref::<hyper::Error>() {
                // Canceled: the connection went away with the request queued on it
                // (tonic's channels report a killed instance so).
                broken |= hyper.is_incomplete_message() || hyper.is_canceled();
                // A client connection's only timeout: a keep-alive PING unanswered.
                unresponsive |= hyper.is_timeout();
            }
            if let Some(h2) = e.downcast_ref::<h2::Error>() {
                // A stream the instance refused, or one above the last stream of its
                // graceful GOAWAY (a server shutting down): never processed (RFC 9113
                // §8.7, §6.8), so it may go anywhere, whatever its method.
                let refused = h2.reason() == Some(h2::Reason::REFUSED_STREAM);
                let graceful = h2.is_go_away() && h2.reason() == Some(h2::Reason::NO_ERROR);
                unsent |= h2.is_remote() && (refused || graceful);
            }
        }
        current = e.source();
    }
    // An unanswered PING says the host is gone, whatever else the error says: out at
    // once (and retried as a broken request).
    match (unresponsive, unsent, broken) {
        (true, _, _) => Failure::Unresponsive,
        (false, true, _) => Failure::Unsent,
        (false, false, true) => Failure::Broken,
        (false, false, false) => Failure::Other,
    }
}

/// Whether [`classify`] calls `error` a connection error (refused, unsent, broken or
/// unresponsive).
pub fn is_connection_error(error: &(dyn Error + 'static)) -> bool {
    classify(error).is_connection()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapped(io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "request failed")
        }
    }

    impl Error for Wrapped {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_client_abort_anywhere_is_the_clients() {
        let reset = ClientAborted::new(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(classify(&reset), Failure::Client);
        #[derive(Debug)]
        struct Send(ClientAborted);
        impl std::fmt::Display for Send {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("sending the body")
            }
        }
        impl Error for Send {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        let refused = ClientAborted::new(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(
            classify(&Send(refused)),
            Failure::Client,
            "whatever is below it"
        );
    }

    #[test]
    fn kinds_anywhere_in_the_chain() {
        let wrap = |kind| Wrapped(io::Error::from(kind));
        for (kind, failure) in [
            (io::ErrorKind::ConnectionRefused, Failure::Refused),
            (io::ErrorKind::HostUnreachable, Failure::Unsent),
            (io::ErrorKind::ConnectionReset, Failure::Broken),
            (io::ErrorKind::UnexpectedEof, Failure::Broken),
            (io::ErrorKind::TimedOut, Failure::Other),
            (io::ErrorKind::InvalidData, Failure::Other),
        ] {
            assert_eq!(classify(&wrap(kind)), failure, "{kind:?}");
            assert_eq!(classify(&io::Error::from(kind)), failure, "{kind:?}");
        }
        // An endpoint that handed the request back: unsent, whatever is below; refused
        // still wins.
        let reset = Unsent::new((), io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(classify(&reset), Failure::Unsent);
        let refused = Unsent::new((), io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(classify(&refused), Failure::Refused);
        assert!(Failure::Refused.nothing_sent() && !Failure::Broken.nothing_sent());
        assert!(Failure::Broken.is_connection() && !Failure::Other.is_connection());
        assert!(!Failure::Client.is_connection() && !Failure::Client.nothing_sent());
    }

    #[cfg(feature = "rustls")]
    #[test]
    fn tls_errors_are_connection_errors() {
        use rustls::{CertificateError, Error as Tls};
        let unknown_ca = || Tls::InvalidCertificate(CertificateError::UnknownIssuer);
        // As tokio-rustls reports a failed handshake: inside an `io::Error` (InvalidData).
        let io = io::Error::new(io::ErrorKind::InvalidData, unknown_ca());
        assert_eq!(classify(&io), Failure::Broken);
        assert_eq!(classify(&Wrapped(io)), Failure::Broken);
        assert_eq!(classify(&unknown_ca()), Failure::Broken);
        // Handed back unsent by the endpoint: any request may go elsewhere.
        let unsent = Unsent::new((), io::Error::new(io::ErrorKind::InvalidData, unknown_ca()));
        assert_eq!(classify(&unsent), Failure::Unsent);
        // Other invalid data is no connection error.
        assert_eq!(
            classify(&io::Error::from(io::ErrorKind::InvalidData)),
            Failure::Other
        );
    }
}
