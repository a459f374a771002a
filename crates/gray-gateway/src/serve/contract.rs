//! What parking relies on of hyper (see [`ConnState::parkable`]), checked against hyper
//! itself: a bare `hyper::server::conn::http1` connection over the same I/O wrapper and
//! service as the gateway's, with no burst logic around it. A hyper release that changes
//! one of these fails here, rather than losing or corrupting a parked connection's bytes.

use std::{
    convert::Infallible,
    future::{Future, poll_fn},
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::Poll,
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::{
    io::AsyncWriteExt,
    net::{TcpListener, TcpStream},
};

use super::{
    counted::{Adapter, Counted},
    observed::ObservedIo,
    state::{Busy, ConnState},
};
use crate::config::Limits;

/// A bound on every wait: generous, for a loaded machine.
const WAIT: Duration = Duration::from_secs(10);

async fn hello(_: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
}

/// A loopback connection: the client's end, and the server's end with its peer.
async fn pair() -> (TcpStream, TcpStream, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, peer) = listener.accept().await.unwrap();
    (client, server, peer)
}

type Service = Adapter<Counted<tower::util::ServiceFn<fn(Request<Incoming>) -> HelloFuture>>>;
type HelloFuture = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>>;

fn service(state: &Arc<ConnState>, peer: SocketAddr) -> Service {
    let hello: fn(Request<Incoming>) -> HelloFuture = |req| Box::pin(hello(req));
    Adapter {
        service: Counted {
            inner: tower::service_fn(hello),
            state: state.clone(),
            peer,
        },
    }
}

/// A bare hyper HTTP/1.1 connection over `server`, with the gateway's I/O wrapper and
/// request counting around it.
fn http1(
    server: TcpStream,
    state: &Arc<ConnState>,
    peer: SocketAddr,
) -> Pin<Box<hyper::server::conn::http1::Connection<TokioIo<ObservedIo<TcpStream>>, Service>>> {
    let io = TokioIo::new(ObservedIo::new(server, state.clone()));
    Box::pin(hyper::server::conn::http1::Builder::new().serve_connection(io, service(state, peer)))
}

/// Polls `conn` until the client has read `n` answers, then once more.
async fn serve_answers<C>(conn: &mut Pin<Box<C>>, client: &mut TcpStream, n: usize) -> Poll<()>
where
    C: Future<Output = hyper::Result<()>>,
{
    let answers = async { gray_test_support::net::read_answers(client, n).await };
    tokio::time::timeout(WAIT, async {
        tokio::select! {
            done = conn.as_mut() => panic!("the connection ended while serving: {done:?}"),
            answers = answers => assert_eq!(answers.len(), n),
        }
    })
    .await
    .expect("answered in time");
    poll_fn(|cx| Poll::Ready(conn.as_mut().poll(cx).map(|_| ()))).await
}

#[tokio::test]
async fn hyper_is_idle_between_requests_as_parking_assumes() {
    let (mut client, server, peer) = pair().await;
    let state = Arc::new(ConnState::new(&Limits::default()));
    let mut conn = http1(server, &state, peer);

    // Before the first request, a new connection is reading its head.
    assert_eq!(state.parkable(|| true), Err(Busy::Reading));
    client
        .write_all(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // Once its response is out, hyper has flushed it and read until its read was
    // `Pending`: nothing of the client's is left unread, nothing of its own unwritten.
    assert!(serve_answers(&mut conn, &mut client, 1).await.is_pending());
    assert_eq!(state.parkable(|| false), Err(Busy::NotAsked));
    assert_eq!(state.parkable(|| true), Ok(()));

    // `graceful_shutdown` of a connection idle between requests, then `without_shutdown`:
    // resolved at once, the socket handed back whole and not shut down, nothing read ahead.
    conn.as_mut().graceful_shutdown();
    let mut unwrapping = Box::pin(Pin::into_inner(conn).without_shutdown());
    let parts = match poll_fn(|cx| Poll::Ready(unwrapping.as_mut().poll(cx))).await {
        Poll::Ready(parts) => parts.expect("an idle connection unwraps cleanly"),
        Poll::Pending => panic!("an idle connection's graceful shutdown waited for I/O"),
    };
    assert!(parts.read_buf.is_empty(), "{:?}", parts.read_buf);
    let server = parts.io.into_inner().into_inner();

    // The same socket serves the next request on a new hyper connection: the client's
    // end was neither written to nor closed in between.
    state.unpark();
    let mut conn = http1(server, &state, peer);
    client
        .write_all(b"GET /b HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(serve_answers(&mut conn, &mut client, 1).await.is_pending());
}

#[tokio::test]
async fn hyper_answers_pipelined_requests_before_it_is_idle() {
    let (mut client, server, peer) = pair().await;
    let state = Arc::new(ConnState::new(&Limits::default()));
    let mut conn = http1(server, &state, peer);
    // Two requests in one write: hyper reads both at once, and must answer the second
    // from its buffer before it is idle (parkable) again, or hand it back in `read_buf`.
    client
        .write_all(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\nGET /b HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(serve_answers(&mut conn, &mut client, 2).await.is_pending());
    assert_eq!(state.parkable(|| true), Ok(()));
    conn.as_mut().graceful_shutdown();
    let parts = Pin::into_inner(conn).without_shutdown().await.unwrap();
    assert!(parts.read_buf.is_empty(), "{:?}", parts.read_buf);
}

#[tokio::test]
async fn a_request_with_a_body_is_not_parked_until_one_without() {
    let (mut client, server, peer) = pair().await;
    let state = Arc::new(ConnState::new(&Limits::default()));
    let mut conn = http1(server, &state, peer);
    // The service answers without reading the body: hyper reads or discards it
    // afterwards, which `read_buf` would not show.
    client
        .write_all(b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello")
        .await
        .unwrap();
    assert!(serve_answers(&mut conn, &mut client, 1).await.is_pending());
    assert_eq!(state.parkable(|| true), Err(Busy::Body));
    client
        .write_all(b"GET /b HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(serve_answers(&mut conn, &mut client, 1).await.is_pending());
    assert_eq!(state.parkable(|| true), Ok(()));
}
