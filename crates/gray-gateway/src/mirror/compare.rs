//! Comparing a copy's answer with the answer the user got: the status class, the headers
//! not known to vary, and the body, byte for byte, or field by field when both are JSON.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, StatusCode, header};
use serde_json::Value;

/// One answer, as far as it is compared.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    /// The body, or `None` when it was longer than the bytes compared (or did not finish).
    pub(crate) body: Option<Bytes>,
}

/// Where two answers differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Difference {
    /// Their status classes (2xx, 4xx…).
    Status,
    /// A header's values.
    Header(HeaderName),
    /// A JSON field, by its pointer (`/items/0/price`; `` for the whole document).
    Field(String),
    /// The bodies, compared as bytes.
    Body,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Difference::Status => f.write_str("status"),
            Difference::Header(name) => write!(f, "header {name}"),
            Difference::Field(pointer) if pointer.is_empty() => f.write_str("json /"),
            Difference::Field(pointer) => write!(f, "json {pointer}"),
            Difference::Body => f.write_str("body"),
        }
    }
}

/// Response headers that vary from one answer to the next by nature, never compared.
const VARYING: &[&str] = &[
    "date",
    "age",
    "expires",
    "last-modified",
    "etag",
    "set-cookie",
    "server-timing",
    "x-request-id",
    "x-correlation-id",
    "x-trace-id",
    "traceparent",
    "tracestate",
    "x-b3-traceid",
    "x-b3-spanid",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "x-gray-instance",
];

/// What a comparison leaves out: headers and JSON fields.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ignore {
    headers: Vec<HeaderName>,
    /// JSON pointers, split into their tokens (`*`: any key or index).
    fields: Vec<Vec<String>>,
}

impl Ignore {
    /// The headers known to vary, `headers`, and the JSON fields of `pointers`.
    pub(crate) fn new(headers: &[HeaderName], pointers: &[String]) -> Self {
        let mut all: Vec<HeaderName> = VARYING
            .iter()
            .map(|name| HeaderName::from_static(name))
            .collect();
        all.extend(headers.iter().cloned());
        Ignore {
            headers: all,
            fields: pointers.iter().map(|p| tokens(p)).collect(),
        }
    }

    fn header(&self, name: &HeaderName) -> bool {
        self.headers.contains(name)
    }

    fn field(&self, path: &[String]) -> bool {
        self.fields.iter().any(|pattern| {
            pattern.len() == path.len() && pattern.iter().zip(path).all(|(p, t)| p == "*" || p == t)
        })
    }
}

/// The tokens of a JSON pointer (RFC 6901: `~1` is `/`, `~0` is `~`).
fn tokens(pointer: &str) -> Vec<String> {
    pointer
        .split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect()
}

/// A JSON pointer of `path`.
fn pointer(path: &[String]) -> String {
    let mut out = String::new();
    for token in path {
        out.push('/');
        out.push_str(&token.replace('~', "~0").replace('/', "~1"));
    }
    out
}

/// The differences between the user's answer `primary` and the copy's `copy`, but those
/// `ignore` leaves out; empty when they match.
pub(crate) fn compare(primary: &Answer, copy: &Answer, ignore: &Ignore) -> Vec<Difference> {
    let mut differences = Vec::new();
    if primary.status.as_u16() / 100 != copy.status.as_u16() / 100 {
        differences.push(Difference::Status);
    }
    // Each name once: the primary's, then those only the copy has.
    let names = primary.headers.keys().chain(
        copy.headers
            .keys()
            .filter(|name| !primary.headers.contains_key(*name)),
    );
    for name in names {
        if ignore.header(name) {
            continue;
        }
        let a = primary.headers.get_all(name).iter();
        let b = copy.headers.get_all(name).iter();
        if !a.eq(b) {
            differences.push(Difference::Header(name.clone()));
        }
    }
    if let (Some(a), Some(b)) = (&primary.body, &copy.body)
        && a != b
    {
        // Equal bytes are equal JSON: only bodies that differ are parsed.
        match (json(&primary.headers, a), json(&copy.headers, b)) {
            (Some(a), Some(b)) => {
                let mut path = Vec::new();
                diff(&a, &b, &mut path, ignore, &mut differences);
            }
            _ => differences.push(Difference::Body),
        }
    }
    differences
}

/// `body` as JSON, when its content type says JSON and it parses.
fn json(headers: &HeaderMap, body: &Bytes) -> Option<Value> {
    let content_type = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = content_type.split(';').next()?.trim().to_ascii_lowercase();
    if essence != "application/json" && !essence.ends_with("+json") {
        return None;
    }
    serde_json::from_slice(body).ok()
}

/// The fields where `a` and `b` differ, under `path`.
fn diff(a: &Value, b: &Value, path: &mut Vec<String>, ignore: &Ignore, out: &mut Vec<Difference>) {
    if ignore.field(path) {
        return;
    }
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                path.push(key.clone());
                match b.get(key) {
                    Some(other) => diff(value, other, path, ignore, out),
                    None if !ignore.field(path) => out.push(Difference::Field(pointer(path))),
                    None => {}
                }
                path.pop();
            }
            for key in b.keys().filter(|k| !a.contains_key(*k)) {
                path.push(key.clone());
                if !ignore.field(path) {
                    out.push(Difference::Field(pointer(path)));
                }
                path.pop();
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                path.push(i.to_string());
                match (a.get(i), b.get(i)) {
                    (Some(x), Some(y)) => diff(x, y, path, ignore, out),
                    _ if !ignore.field(path) => out.push(Difference::Field(pointer(path))),
                    _ => {}
                }
                path.pop();
            }
        }
        (a, b) if a != b => out.push(Difference::Field(pointer(path))),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, content_type: &str, body: &str) -> Answer {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, content_type.parse().unwrap());
        Answer {
            status: StatusCode::from_u16(status).unwrap(),
            headers,
            body: Some(Bytes::copy_from_slice(body.as_bytes())),
        }
    }

    #[test]
    fn json_is_compared_field_by_field_whatever_the_order_of_keys() {
        let ignore = Ignore::new(&[], &[]);
        let a = answer(
            200,
            "application/json",
            r#"{"id":1,"items":[{"p":2},{"p":3}]}"#,
        );
        let b = answer(
            200,
            "application/json",
            r#"{"items":[{"p":2},{"p":3}],"id":1}"#,
        );
        assert_eq!(compare(&a, &b, &ignore), vec![]);
        let c = answer(
            200,
            "application/json",
            r#"{"id":1,"items":[{"p":2},{"p":4}],"new":0}"#,
        );
        assert_eq!(
            compare(&a, &c, &ignore),
            vec![
                Difference::Field("/items/1/p".into()),
                Difference::Field("/new".into())
            ]
        );
    }

    #[test]
    fn ignored_fields_take_wildcards_and_escapes() {
        let ignore = Ignore::new(&[], &["/items/*/ts".into(), "/a~1b".into()]);
        let a = answer(
            200,
            "application/json",
            r#"{"items":[{"ts":1,"p":2}],"a/b":1}"#,
        );
        let b = answer(
            200,
            "application/json",
            r#"{"items":[{"ts":9,"p":2}],"a/b":2}"#,
        );
        assert_eq!(compare(&a, &b, &ignore), vec![]);
    }

    #[test]
    fn status_classes_headers_and_bytes() {
        let ignore = Ignore::new(&[HeaderName::from_static("x-build")], &[]);
        let mut a = answer(200, "text/plain", "hello");
        let mut b = answer(201, "text/plain", "hello");
        a.headers.insert("date", "Mon".parse().unwrap());
        b.headers.insert("date", "Tue".parse().unwrap());
        b.headers.insert("x-build", "2".parse().unwrap());
        assert_eq!(compare(&a, &b, &ignore), vec![], "201 is 2xx as 200 is");
        b.headers
            .insert("cache-control", "no-store".parse().unwrap());
        b.status = StatusCode::INTERNAL_SERVER_ERROR;
        b.body = Some(Bytes::from_static(b"hellO"));
        assert_eq!(
            compare(&a, &b, &ignore),
            vec![
                Difference::Status,
                Difference::Header(header::CACHE_CONTROL),
                Difference::Body
            ]
        );
        // A body not caught whole is not compared.
        b.body = None;
        assert_eq!(compare(&a, &b, &ignore).len(), 2);
    }
}
