//! WebDriver over HTTP: one request and its answer or [`WebDriverError`], chromedriver's
//! readiness, and the session's deletion over a hand-written HTTP/1.1 request (a drop
//! cannot await).

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use serde_json::Value;
use tokio::process::Child;

use super::{POLL, READY_WITHIN};

/// A WebDriver error answer: `value.error` and `value.message`.
#[derive(Debug)]
pub(super) struct WebDriverError {
    pub(super) error: String,
    message: String,
}

impl std::fmt::Display for WebDriverError {
    /// `error: message`, the error once: chromedriver's messages often start with it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.message.starts_with(&self.error) {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.error, self.message)
        }
    }
}

/// Waits until chromedriver on `port` reports `ready`, or returns how it exited.
pub(super) async fn wait_ready(
    client: &reqwest::Client,
    port: u16,
    driver: &mut Child,
) -> Result<(), String> {
    let start = Instant::now();
    let url = format!("http://127.0.0.1:{port}/status");
    loop {
        if let Some(status) = driver.try_wait().expect("chromedriver's status") {
            return Err(status.to_string());
        }
        if let Ok(response) = client
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            && let Ok(status) = response.json::<Value>().await
            && status["value"]["ready"] == true
        {
            return Ok(());
        }
        assert!(
            start.elapsed() < READY_WITHIN,
            "chromedriver on port {port} not ready within {READY_WITHIN:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Sends one WebDriver request, returning the answer's `value` or its error.
pub(super) async fn request(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
) -> Result<Value, WebDriverError> {
    let mut builder = client.request(method.clone(), url);
    if let Some(body) = body {
        builder = builder.json(body);
    }
    let response = builder
        .send()
        .await
        .unwrap_or_else(|e| panic!("WebDriver {method} {url}: {e}"));
    let status = response.status();
    let mut answer: Value = response
        .json()
        .await
        .unwrap_or_else(|e| panic!("WebDriver {method} {url} ({status}): not JSON: {e}"));
    let value = answer["value"].take();
    match value.get("error").and_then(Value::as_str) {
        Some(error) => Err(WebDriverError {
            error: error.to_owned(),
            message: value["message"].as_str().unwrap_or_default().to_owned(),
        }),
        None => Ok(value),
    }
}

/// `DELETE /session/{session}` on chromedriver at `port`, over a hand-written HTTP/1.1
/// request, waiting (at most 15 s) for the answer; best effort.
pub(super) fn delete_session(port: u16, session: &str) {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let request = format!(
        "DELETE /session/{session} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\
         Connection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return;
    }
    // The answer comes once Chromium has quit. chromedriver says `Connection: close` but
    // keeps the connection open: the answer ends after its `Content-Length`.
    let mut answer = Vec::new();
    let mut buf = [0; 4096];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
        if answer_complete(&answer) {
            return;
        }
    }
}

/// Whether `answer` holds a whole HTTP/1.1 answer: its head, and as many bytes of body as
/// its `Content-Length` says (none without one).
fn answer_complete(answer: &[u8]) -> bool {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let length = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse::<usize>().ok())
        .unwrap_or(0);
    answer.len() >= end + 4 + length
}

#[cfg(test)]
mod tests {
    use super::answer_complete;

    #[test]
    fn an_answer_ends_after_its_content_length() {
        // chromedriver's answer to `DELETE /session/{id}`, which it does not close
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length:14\r\nContent-Type:application/json; \
                       charset=utf-8\r\nConnection:close\r\n\r\n{\"value\":null}";
        assert!(answer_complete(answer));
        assert!(!answer_complete(&answer[..answer.len() - 1]));
        assert!(!answer_complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n"
        ));
        assert!(answer_complete(b"HTTP/1.1 204 No Content\r\n\r\n"));
    }
}
