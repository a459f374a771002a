//! The routing checks: plain HTTP/1.1 requests on std's `TcpStream`, one connection each
//! (as a fresh `curl` would), and what each target must answer before it is measured.

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use super::Result;

/// The path every check asks for; the upstream must see it without `/svc`.
const CHECK_PATH: &str = "/svc/check/path?q=1";
const SEEN_PATH: &str = "/check/path?q=1";
/// Requests per lane.
const CHECKS: usize = 20;

/// A response's status and headers (names in lower case).
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
}

impl Reply {
    /// The first value of header `name` (lower case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` on a new connection to `addr` with `headers`, within `timeout` in all.
pub(crate) fn get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> io::Result<Reply> {
    let deadline = Instant::now() + timeout;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(timeout))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\naccept: */*\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;

    let mut buf = Vec::with_capacity(1024);
    let head_end = loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            break end;
        }
        if buf.len() > 64 * 1024 {
            return Err(io::Error::other("response head over 64 KiB"));
        }
        if read_some(&mut stream, &mut buf, deadline)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before the response head ended",
            ));
        }
    };
    let reply = parse_head(&buf[..head_end])?;
    // Read the body the head announces, so that the connection ends cleanly.
    if let Some(length) = reply
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        while buf.len() < head_end + 4 + length {
            if read_some(&mut stream, &mut buf, deadline)? == 0 {
                break;
            }
        }
    }
    Ok(reply)
}

/// Reads what has arrived into `buf`, waiting until `deadline` at most.
fn read_some(stream: &mut TcpStream, buf: &mut Vec<u8>, deadline: Instant) -> io::Result<usize> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no response in time",
        ));
    }
    stream.set_read_timeout(Some(left))?;
    let mut chunk = [0; 4096];
    let n = stream.read(&mut chunk)?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn parse_head(head: &[u8]) -> io::Result<Reply> {
    let head = String::from_utf8_lossy(head);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other(format!("not an HTTP status line: `{status_line}`")))?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Ok(Reply { status, headers })
}

/// Checks one lane of a target: 20 requests, each answered 200 by an instance whose id
/// starts with `instance_prefix`, the upstream seeing the path without `/svc`, and both
/// instances of the lane serving. Prints who served how many.
pub(crate) fn check_lane(
    label: &str,
    addr: SocketAddr,
    what: &str,
    instance_prefix: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<()> {
    let mut served: Vec<(String, usize)> = Vec::new();
    for _ in 0..CHECKS {
        let reply = get(addr, CHECK_PATH, headers, timeout)
            .map_err(|e| format!("{label}, {what}: no answer to GET {CHECK_PATH} ({e})"))?;
        let instance = reply.header("x-instance").unwrap_or("-").to_owned();
        if reply.status != 200 {
            return Err(format!(
                "{label}, {what}: status {} (instance {instance}), expected 200",
                reply.status
            ));
        }
        if !instance.starts_with(instance_prefix) {
            return Err(format!(
                "{label}, {what}: served by `{instance}`, expected {instance_prefix}*"
            ));
        }
        let path = reply.header("x-seen-path").unwrap_or("-");
        if path != SEEN_PATH {
            return Err(format!(
                "{label}, {what}: upstream saw path `{path}`, expected {SEEN_PATH}"
            ));
        }
        match served.iter_mut().find(|(id, _)| *id == instance) {
            Some((_, n)) => *n += 1,
            None => served.push((instance, 1)),
        }
    }
    if served.len() != 2 {
        return Err(format!(
            "{label}, {what}: served by {} instance(s) of the lane's 2 in {CHECKS} requests",
            served.len()
        ));
    }
    served.sort();
    let counts: Vec<String> = served.iter().map(|(id, n)| format!("{id}×{n}")).collect();
    println!("  {label:<16} {what:<20} -> {}", counts.join(" "));
    Ok(())
}

/// Checks one lane of a TLS listener with curl (`--cacert cert`), as [`check_lane`] does
/// over plaintext: 4 requests, each answered 200 by an instance whose id starts with
/// `instance_prefix`, the upstream seeing the path without `/svc`.
pub(crate) fn check_tls_lane(
    label: &str,
    addr: SocketAddr,
    cert: &std::path::Path,
    what: &str,
    instance_prefix: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<()> {
    let url = format!("https://{addr}{CHECK_PATH}");
    let mut served = Vec::new();
    for _ in 0..4 {
        let mut curl = std::process::Command::new("curl");
        curl.args([
            "--silent",
            "--show-error",
            "--noproxy",
            "*",
            "--output",
            "/dev/null",
        ])
        .arg("--cacert")
        .arg(cert)
        .arg("--max-time")
        .arg(timeout.as_secs().max(1).to_string())
        .args([
            "--write-out",
            "%{http_code} %header{x-instance} %header{x-seen-path}",
        ]);
        for (name, value) in headers {
            curl.arg("--header").arg(format!("{name}: {value}"));
        }
        let output = curl
            .arg(&url)
            .output()
            .map_err(|e| format!("{label}, {what}: cannot run curl: {e}"))?;
        let out = String::from_utf8_lossy(&output.stdout);
        let mut fields = out.split(' ');
        let (status, instance, path) = (fields.next(), fields.next(), fields.next());
        if !output.status.success() || status != Some("200") {
            return Err(format!(
                "{label}, {what}: GET {url}: `{out}` ({}) {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let instance = instance.unwrap_or("-");
        if !instance.starts_with(instance_prefix) || path != Some(SEEN_PATH) {
            return Err(format!(
                "{label}, {what}: served by `{instance}` seeing `{}`, expected {instance_prefix}* seeing {SEEN_PATH}",
                path.unwrap_or("-")
            ));
        }
        served.push(instance.to_owned());
    }
    println!("  {label:<16} {what:<20} -> {}", served.join(" "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{net::TcpListener, thread};

    use super::*;

    /// Answers each connection's request with `response`, for `connections` connections,
    /// and hands back the requests it read.
    fn server(
        response: &'static str,
        connections: usize,
    ) -> (SocketAddr, thread::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = thread::spawn(move || {
            let mut requests = Vec::new();
            for _ in 0..connections {
                let (mut stream, _) = listener.accept().unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                let mut buf = Vec::new();
                while find(&buf, b"\r\n\r\n").is_none() {
                    let mut chunk = [0; 1024];
                    let n = stream.read(&mut chunk).unwrap();
                    assert!(n > 0, "the client closed before its request ended");
                    buf.extend_from_slice(&chunk[..n]);
                }
                requests.push(String::from_utf8(buf).unwrap());
                stream.write_all(response.as_bytes()).unwrap();
            }
            requests
        });
        (addr, handle)
    }

    #[test]
    fn reads_status_and_headers_and_sends_the_extra_header() {
        let (addr, handle) = server(
            "HTTP/1.1 200 OK\r\nX-Instance: gray-1\r\ncontent-length: 6\r\n\r\ngray-1",
            1,
        );
        let reply = get(
            addr,
            "/svc/x",
            &[("x-gray-lane", "gray")],
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("x-instance"), Some("gray-1"));
        let requests = handle.join().unwrap();
        assert!(
            requests[0].starts_with("GET /svc/x HTTP/1.1\r\n"),
            "{}",
            requests[0]
        );
        assert!(
            requests[0].contains("\r\nx-gray-lane: gray\r\n"),
            "{}",
            requests[0]
        );
    }

    #[test]
    fn a_lane_served_by_one_instance_fails_the_check() {
        let (addr, handle) = server(
            "HTTP/1.1 200 OK\r\nx-instance: base-1\r\nx-seen-path: /check/path?q=1\r\n\
             content-length: 0\r\n\r\n",
            CHECKS,
        );
        let err = check_lane(
            "nginx",
            addr,
            "no header",
            "base-",
            &[],
            Duration::from_secs(10),
        )
        .unwrap_err();
        assert!(err.contains("served by 1 instance(s)"), "{err}");
        handle.join().unwrap();
    }

    #[test]
    fn a_path_left_unstripped_fails_the_check() {
        let (addr, handle) = server(
            "HTTP/1.1 200 OK\r\nx-instance: base-1\r\nx-seen-path: /svc/check/path?q=1\r\n\
             content-length: 0\r\n\r\n",
            1,
        );
        let err = check_lane(
            "bare",
            addr,
            "no header",
            "base-",
            &[],
            Duration::from_secs(10),
        )
        .unwrap_err();
        assert!(
            err.contains("upstream saw path `/svc/check/path?q=1`"),
            "{err}"
        );
        handle.join().unwrap();
    }

    #[test]
    fn a_silent_server_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let err = get(addr, "/", &[], Duration::from_millis(300)).unwrap_err();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{err:?}"
        );
        drop(listener);
    }
}
