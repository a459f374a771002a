//! The gRPC health check (feature `grpc-health`): one `grpc.health.v1.Health/Check` call
//! over plain HTTP/2, its two messages encoded by hand (one string field out, one enum
//! field back).

use bytes::{BufMut, Bytes, BytesMut};
use http::{Request, header::CONTENT_TYPE, uri::Authority};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tower::BoxError;

/// `HealthCheckResponse.ServingStatus.SERVING`.
const SERVING: u64 = 1;

/// Asks the server on `stream` whether `service` is serving.
pub(super) async fn check(
    stream: TcpStream,
    authority: &Authority,
    service: &str,
) -> Result<(), BoxError> {
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
    // The connection ends with the probe: its sender and its one stream are dropped.
    tokio::spawn(connection);
    let request = Request::post(format!("http://{authority}/grpc.health.v1.Health/Check"))
        .header(CONTENT_TYPE, "application/grpc")
        .header("te", "trailers")
        .body(Full::new(frame(service)))?;
    let response = sender.send_request(request).await?;
    if response.status() != http::StatusCode::OK {
        return Err(format!("the health check answered HTTP {}", response.status()).into());
    }
    let headers = response.headers().clone();
    let body = response.into_body().collect().await?;
    let trailers = body.trailers().cloned().unwrap_or_default();
    // A trailers-only answer carries its status in the headers.
    let code = trailers
        .get("grpc-status")
        .or_else(|| headers.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if code != "0" {
        let message = trailers
            .get("grpc-message")
            .or_else(|| headers.get("grpc-message"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        return Err(format!("the health check failed: grpc-status {code:?} {message}").into());
    }
    let status = serving_status(&body.to_bytes())
        .ok_or("the health check's answer is not a HealthCheckResponse")?;
    if status == SERVING {
        Ok(())
    } else {
        Err(format!("the health check answered status {status}, not SERVING").into())
    }
}

/// A length-prefixed `HealthCheckRequest { service }`.
fn frame(service: &str) -> Bytes {
    let mut message = BytesMut::new();
    if !service.is_empty() {
        message.put_u8(0x0a); // field 1, length-delimited
        put_varint(&mut message, service.len() as u64);
        message.put_slice(service.as_bytes());
    }
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0); // not compressed
    framed.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    framed.put_slice(&message);
    framed.freeze()
}

fn put_varint(buf: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        buf.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    buf.put_u8(value as u8);
}

fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// The `status` of a length-prefixed `HealthCheckResponse` (0, UNKNOWN, when absent).
fn serving_status(framed: &[u8]) -> Option<u64> {
    let (&compressed, rest) = framed.split_first()?;
    if compressed != 0 || rest.len() < 4 {
        return None;
    }
    let len = u32::from_be_bytes(rest[..4].try_into().ok()?) as usize;
    let mut message = rest.get(4..4 + len)?;
    let mut status = 0;
    while !message.is_empty() {
        let (key, n) = varint(message)?;
        message = &message[n..];
        match key & 7 {
            0 => {
                let (value, n) = varint(message)?;
                message = &message[n..];
                if key >> 3 == 1 {
                    status = value;
                }
            }
            2 => {
                let (len, n) = varint(message)?;
                message = message.get(n + len as usize..)?;
            }
            _ => return None,
        }
    }
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_and_decodes_the_two_messages() {
        assert_eq!(&frame("")[..], [0, 0, 0, 0, 0]);
        assert_eq!(
            &frame("svc")[..],
            [0, 0, 0, 0, 5, 0x0a, 3, b's', b'v', b'c']
        );
        assert_eq!(serving_status(&[0, 0, 0, 0, 2, 0x08, 1]), Some(SERVING));
        assert_eq!(serving_status(&[0, 0, 0, 0, 2, 0x08, 2]), Some(2));
        assert_eq!(serving_status(&[0, 0, 0, 0, 0]), Some(0));
        assert_eq!(serving_status(&[1, 0, 0, 0, 0]), None);
        assert_eq!(serving_status(&[0, 0, 0, 0, 9, 0x08]), None);
    }
}
