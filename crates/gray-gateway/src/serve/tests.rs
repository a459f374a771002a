//! HTTP/1.1 connections served in bursts and parked between them (`conn`), on real
//! loopback sockets: what a client sends across a park arrives whole and in order, and a
//! parked connection ends with its client or with a drain.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

use super::{Server, conn, counted::Counted, state::ConnState, watchdog::watchdog};
use crate::{config::Limits, drain::Drain};

/// A bound on every wait: generous, for a loaded machine.
const WAIT: Duration = Duration::from_secs(10);

/// Answers `<method> <path> <body>` for each request.
async fn echo(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let line = format!("{} {} ", req.method(), req.uri().path());
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let mut text = line.into_bytes();
    text.extend_from_slice(&body.unwrap_or_default());
    Ok(Response::new(Full::new(Bytes::from(text))))
}

/// One client connection served by `conn::serve`: the client's end, the connection's
/// state, and the task serving it.
struct Served {
    client: TcpStream,
    state: Arc<ConnState>,
    task: JoinHandle<()>,
    drain: Drain,
}

/// Served with a watchdog that parks a connection a tick (a quarter of the shortest
/// timeout, here 0.5 s) after it went idle.
async fn served() -> Served {
    let limits = Limits {
        header_read_timeout: Some(Duration::from_secs(2)),
        ..Limits::default()
    };
    served_with(limits, true).await
}

async fn served_with(limits: Limits, watched: bool) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (stream, peer): (TcpStream, SocketAddr) = listener.accept().await.unwrap();
    let server = Server::new(limits);
    let state = Arc::new(ConnState::new(&limits));
    let service = Counted {
        inner: tower::service_fn(echo),
        state: state.clone(),
        peer,
    };
    let drain = Drain::new();
    let member = drain.join();
    // The connection's slot, as the accept loop takes it.
    let permit = server.permits.clone().try_acquire_owned().unwrap();
    let task = tokio::spawn(async move {
        let service = super::counted::Adapter { service };
        conn::serve(&server, stream, service, member).await.unwrap();
        drop(permit);
    });
    if watched {
        tokio::spawn(watchdog(
            state.clone(),
            task.abort_handle(),
            (&limits).into(),
            peer,
        ));
    }
    Served {
        client,
        state,
        task,
        drain,
    }
}

impl Served {
    /// Reads `n` answers (each a 200) and returns their bodies.
    async fn answers(&mut self, n: usize) -> Vec<String> {
        let answers = gray_test_support::net::read_answers(&mut self.client, n).await;
        answers
            .into_iter()
            .map(|a| {
                assert_eq!(a.status, 200, "{a:?}");
                a.body
            })
            .collect()
    }

    /// Waits until the connection has been parked `n` times in all.
    async fn parked(&self, n: u64) {
        tokio::time::timeout(WAIT, async {
            while self.state.parks() < n {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("parked {} times, not {n}", self.state.parks()));
        assert_eq!(self.state.parks(), n);
    }
}

const GET: &[u8] = b"GET /a HTTP/1.1\r\nhost: t\r\n\r\n";

#[tokio::test]
async fn an_idle_connection_is_parked_and_serves_its_next_request() {
    let mut s = served().await;
    for i in 1..=3 {
        s.client.write_all(GET).await.unwrap();
        assert_eq!(s.answers(1).await, ["GET /a "]);
        s.parked(i).await;
    }
}

#[tokio::test]
async fn with_more_connections_than_release_buffers_above_a_connection_is_parked_at_once() {
    // No watchdog: only the count of open connections can park it.
    let limits = Limits {
        release_buffers_above: 0,
        ..Limits::default()
    };
    let mut s = served_with(limits, false).await;
    for i in 1..=3 {
        s.client.write_all(GET).await.unwrap();
        assert_eq!(s.answers(1).await, ["GET /a "]);
        s.parked(i).await;
    }
}

#[tokio::test]
async fn pipelined_requests_and_a_split_head_across_a_park_arrive_in_order() {
    let mut s = served().await;
    s.client.write_all(GET).await.unwrap();
    assert_eq!(s.answers(1).await, ["GET /a "]);
    s.parked(1).await;
    // Three whole requests and the start of a fourth in one write: hyper reads them
    // together; the start of the fourth is what it read ahead when it goes idle.
    let mut batch = Vec::new();
    for path in ["/b", "/c", "/d"] {
        batch.extend_from_slice(format!("GET {path} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes());
    }
    batch.extend_from_slice(b"GET /e HTTP/1.1\r\nho");
    s.client.write_all(&batch).await.unwrap();
    assert_eq!(s.answers(3).await, ["GET /b ", "GET /c ", "GET /d "]);
    s.client.write_all(b"st: t\r\n\r\n").await.unwrap();
    assert_eq!(s.answers(1).await, ["GET /e "]);
    s.parked(2).await;
}

#[tokio::test]
async fn a_request_body_is_read_whole_and_parking_waits_for_a_request_without_one() {
    let mut s = served().await;
    s.client
        .write_all(b"POST /p HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\nhello")
        .await
        .unwrap();
    s.client.write_all(b"world").await.unwrap();
    assert_eq!(s.answers(1).await, ["POST /p helloworld"]);
    // A request with a body leaves the connection running (hyper may still be reading
    // it), even once the watchdog has seen it idle and the task has been woken.
    tokio::time::timeout(WAIT, async {
        while !s.state.park_requested() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the watchdog saw the connection idle");
    tokio::task::yield_now().await;
    assert_eq!(s.state.parks(), 0);
    s.client.write_all(GET).await.unwrap();
    assert_eq!(s.answers(1).await, ["GET /a "]);
    s.parked(1).await;
    // A chunked body after a park.
    s.client
        .write_all(b"POST /q HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(s.answers(1).await, ["POST /q abc"]);
}

#[tokio::test]
async fn a_parked_connection_ends_when_its_client_closes() {
    let mut s = served().await;
    s.client.write_all(GET).await.unwrap();
    s.answers(1).await;
    s.parked(1).await;
    drop(s.client);
    tokio::time::timeout(WAIT, s.task)
        .await
        .expect("the connection ended")
        .unwrap();
}

#[tokio::test]
async fn a_drain_closes_a_parked_connection_at_once() {
    let mut s = served().await;
    s.client.write_all(GET).await.unwrap();
    s.answers(1).await;
    s.parked(1).await;
    tokio::time::timeout(WAIT, s.drain.shutdown())
        .await
        .expect("the drain finished");
    let mut buf = [0; 16];
    let read = tokio::time::timeout(WAIT, s.client.read(&mut buf))
        .await
        .expect("closed in time");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}
