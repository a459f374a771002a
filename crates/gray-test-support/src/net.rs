//! Raw TCP servers on loopback (feature `net`), for the HTTP tests that need a server to
//! misbehave in a precise way.

use std::{
    future::Future,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpSocket, TcpStream},
};

/// Accepts connections on a free loopback port, each handled by `on_connection` in a task
/// of its own; returns the address and the number of connections accepted so far.
pub async fn serve<F, Fut>(on_connection: F) -> (SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(on_connection(stream));
        }
    });
    (addr, accepted)
}

/// Reads `stream` up to the end of a request head (`\r\n\r\n`); `false` if the connection
/// ended first.
pub async fn read_head(stream: &mut TcpStream) -> bool {
    let mut buf = vec![0; 4096];
    let mut seen = Vec::new();
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    true
}

/// The response every raw server here sends: `200`, body `ok`.
pub const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// An HTTP/1.1 instance that answers [`OK`] as soon as it has read a request's head, without
/// reading its body, and closes the connection `linger` later (a close with unread data is
/// a reset: a short linger lets the client read the response first).
pub async fn answers_early(linger: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    serve(move |mut stream| async move {
        if read_head(&mut stream).await {
            let _ = stream.write_all(OK).await;
            tokio::time::sleep(linger).await;
        }
    })
    .await
}

/// A loopback address nothing listens on, for as long as this value lives: a socket is
/// bound to it and never listens, so a connection to it is refused (the kernel answers a
/// SYN to a port without a listener with a reset), and no other process can be handed the
/// port meanwhile. A port bound, closed and then used races with every other process that
/// binds one.
#[derive(Debug)]
pub struct ClosedPort {
    addr: SocketAddr,
    _socket: TcpSocket,
}

impl ClosedPort {
    /// The address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// A loopback port that refuses connections while the returned value lives.
pub fn closed_port() -> ClosedPort {
    let socket = TcpSocket::new_v4().expect("a TCP socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind a loopback port");
    let addr = socket.local_addr().expect("local address");
    ClosedPort {
        addr,
        _socket: socket,
    }
}

/// Whether `error` or one of its sources is an `io::Error` of kind `ConnectionRefused`.
pub fn is_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_port_refuses_connections_while_it_is_held() {
        let closed = closed_port();
        for _ in 0..3 {
            let error = TcpStream::connect(closed.addr())
                .await
                .expect_err("refused");
            assert_eq!(error.kind(), std::io::ErrorKind::ConnectionRefused);
        }
        // Nobody else can listen on it meanwhile.
        assert!(TcpListener::bind(closed.addr()).await.is_err());
    }
}

/// One HTTP/1.1 response read off a raw connection: its status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The body (`content-length` bytes; none without that header).
    pub body: String,
}

/// Reads `n` HTTP/1.1 responses with `content-length` bodies from `stream`, each within
/// [`WAIT`](crate::WAIT); panics if the connection closes first, a head does not parse, or
/// more than `n` arrive in the bytes read.
pub async fn read_answers(stream: &mut TcpStream, n: usize) -> Vec<Answer> {
    let mut raw = Vec::new();
    let mut answers = Vec::new();
    let mut buf = [0u8; 4096];
    while answers.len() < n {
        let read = tokio::time::timeout(crate::WAIT, stream.read(&mut buf))
            .await
            .expect("answered in time")
            .expect("read the answer");
        assert!(read > 0, "closed after {answers:?}");
        raw.extend_from_slice(&buf[..read]);
        while let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_string();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length").then_some(value)
                })
                .map_or(0, |v| v.trim().parse().expect("a content-length"));
            if raw.len() < end + 4 + length {
                break;
            }
            let status = head
                .get(9..12)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("not a status line: {head}"));
            let body = String::from_utf8_lossy(&raw[end + 4..end + 4 + length]).to_string();
            answers.push(Answer { status, body });
            raw.drain(..end + 4 + length);
        }
    }
    assert!(raw.is_empty(), "more than {n} answers");
    answers
}
