//! The edge's stripping of the stain from an untrusted client, against every spelling that
//! some decoder reads as the stain: after the edge, no `baggage` item remains whose key a
//! lenient decoder reads as `gray.lane`, and no header remains that a CGI-style server
//! (WSGI's `HTTP_X_GRAY_LANE`) reads as a stripped header. The lenient decoder here is a
//! brute-force transcription of the rule (`gray_core::codec::BaggageMember::reads_as_key`),
//! written apart from the edge's own, and it reads every item, parsed by gray's grammar or
//! not, as a decoder that splits on `,` and `=` does.
#![no_main]

use std::{
    cell::RefCell,
    convert::Infallible,
    future::{Ready, ready},
    rc::Rc,
    task::{Context, Poll},
};

use gray_core::Carriers;
use gray_rules::RuleSet;
use gray_tower::edge::{Edge, EdgeLayer, LiveRules};
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use libfuzzer_sys::fuzz_target;
use tower_layer::Layer;
use tower_service::Service;

const KEY: &str = "gray.lane";
const ROUNDS: usize = 8;

/// The service behind the edge: keeps the headers it was called with.
#[derive(Clone, Default)]
struct Seen(Rc<RefCell<Option<HeaderMap>>>);

impl Service<Request<()>> for Seen {
    type Response = ();
    type Error = Infallible;
    type Future = Ready<Result<(), Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<()>) -> Self::Future {
        *self.0.borrow_mut() = Some(req.headers().clone());
        ready(Ok(()))
    }
}

/// UTF-8 where valid, Latin-1 byte by byte where not.
fn chars(bytes: &[u8]) -> Vec<char> {
    let mut out = Vec::new();
    for chunk in bytes.utf8_chunks() {
        out.extend(chunk.valid().chars());
        out.extend(chunk.invalid().iter().map(|&b| char::from(b)));
    }
    out
}

fn is_space(c: char) -> bool {
    u32::from(c) <= 0x20 || c.is_whitespace() || matches!(c, '\u{180E}' | '\u{200B}' | '\u{FEFF}')
}

fn fold(c: char) -> Option<char> {
    match c {
        c if c.is_ascii() => Some(c.to_ascii_lowercase()),
        '\u{212A}' => Some('k'),
        '\u{017F}' => Some('s'),
        '\u{0130}' | '\u{0131}' => Some('i'),
        _ => None,
    }
}

fn percent_decode(text: &[u8]) -> Vec<u8> {
    let hex = |b: Option<&u8>| b.and_then(|&b| char::from(b).to_digit(16));
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        match (text[i], hex(text.get(i + 1)), hex(text.get(i + 2))) {
            (b'%', Some(h), Some(l)) => {
                out.push(u8::try_from(h * 16 + l).expect("two hex digits"));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// Every placement of the key among the characters, with only spaces (or `+`) around it.
fn is_key_with_spaces_around(text: &[char]) -> bool {
    let key: Vec<char> = KEY.chars().collect();
    let around = |c: &char| is_space(*c) || *c == '+';
    (0..=text.len().saturating_sub(key.len())).any(|a| {
        let b = a + key.len();
        b <= text.len()
            && text[..a].iter().all(around)
            && text[b..].iter().all(around)
            && text[a..b].iter().zip(&key).all(|(&c, &k)| fold(c) == Some(k))
    })
}

fn lenient_reads_as_key(raw: &[u8]) -> bool {
    let mut text = raw.to_vec();
    for _ in 0..=ROUNDS {
        if is_key_with_spaces_around(&chars(&text)) {
            return true;
        }
        let next = percent_decode(&text);
        if next == text {
            return false;
        }
        text = next;
    }
    false
}

fn cgi_name(name: &str) -> Vec<u8> {
    name.bytes()
        .map(|b| if b.is_ascii_alphanumeric() { b.to_ascii_lowercase() } else { b'_' })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    // Lines separated by 0xFF: each one a `baggage` line and, when it can be, a header name.
    let mut request = Request::new(());
    for line in data.split(|&b| b == 0xFF).take(8) {
        if let Ok(value) = HeaderValue::from_bytes(line) {
            request.headers_mut().append("baggage", value);
        }
        if let Ok(name) = HeaderName::from_bytes(line) {
            request
                .headers_mut()
                .append(name, HeaderValue::from_static("gray"));
        }
    }
    for carriers in [Carriers::default(), Carriers::default().with_baggage()] {
        let layer = EdgeLayer::new(LiveRules::new(RuleSet::default()))
            .with_carriers(carriers)
            .with_task_local(false);
        let seen = Seen::default();
        let mut edge: Edge<Seen> = layer.layer(seen.clone());
        let mut req = Request::new(());
        *req.headers_mut() = request.headers().clone();
        // The request future is ready at once; the headers were handed over in `call`.
        drop(edge.call(req));
        let headers = seen.0.borrow_mut().take().expect("the service was called");

        for line in headers.get_all("baggage") {
            for item in line.as_bytes().split(|&b| b == b',') {
                if let Some(eq) = item.iter().position(|&b| b == b'=') {
                    let key = &item[..eq];
                    assert!(
                        !lenient_reads_as_key(key),
                        "`{}` is read as {KEY} after the edge: {line:?}",
                        String::from_utf8_lossy(key)
                    );
                }
            }
        }
        let stripped: Vec<Vec<u8>> = layer.stripped_headers().iter().map(|h| cgi_name(h.as_str())).collect();
        for name in headers.keys() {
            assert!(
                !stripped.contains(&cgi_name(name.as_str())),
                "`{name}` reaches a CGI-style server as a stripped header"
            );
        }
    }
});
