//! Request path normalisation: one canonical form for rules and for the upstream.
//!
//! Servers disagree on what `/svc//internal/x`, `/svc/x/../internal/x`, `/svc/./internal/x`
//! or `/svc/%69nternal/x` mean; a rule that reads the raw path and an upstream that
//! normalises it then see two different requests. [`normalize`] gives the one form both
//! should see (the edge rewrites the request to it):
//!
//! 1. percent-encoded **unreserved** characters (`A`–`Z`, `a`–`z`, `0`–`9`, `-`, `.`, `_`,
//!    `~`) are decoded (`%69` → `i`, `%2e` → `.`); every other escape stays, its hex digits
//!    upper-cased (`%c3%a9` → `%C3%A9`), as RFC 3986 §6.2.2 prescribes;
//! 2. repeated slashes are merged (`//` → `/`), **before** dot segments are removed, as
//!    nginx's `merge_slashes` does;
//! 3. dot segments are removed (RFC 3986 §5.2.4): `.` goes, `..` removes the segment before
//!    it; a path ending in a dot segment keeps its trailing slash (`/a/b/..` → `/a/`).
//!
//! Rejected, with a [`PathError`] naming what and where (byte offset in the input):
//!
//! | input | [`PathErrorKind`] | why |
//! |---|---|---|
//! | `/a%2Fb`, `/a%5cb` | `EncodedSlash` | servers disagree on whether it separates segments |
//! | `/a\b` | `Backslash` | WHATWG URL parsers treat it as `/` |
//! | `/a%00b`, a raw NUL | `Nul` | truncates paths in C-based servers |
//! | `/a%zz`, `/a%4` | `BadPercentEncoding` | not an escape; decoders disagree |
//! | `/a/..;/b`, `/a/.;x/b` | `DotSegmentWithParameters` | Tomcat reads `..;` as `..` |
//! | `/..`, `/a/../..` | `AboveRoot` | climbs above the root |
//! | `a/b`, `*` | `NotAbsolute` | not an absolute path |
//!
//! A path that is already normal is returned borrowed: no allocation. The query is not part
//! of the path and is never touched ([`normalize_uri`] keeps it as it is).
//!
//! ```
//! use gray_rules::path::{PathErrorKind, normalize, normalize_uri};
//!
//! assert_eq!(normalize("/svc//internal/x")?, "/svc/internal/x");
//! assert_eq!(normalize("/svc/x/../internal/x")?, "/svc/internal/x");
//! assert_eq!(normalize("/svc/./internal/x")?, "/svc/internal/x");
//! assert_eq!(normalize("/svc/%69nternal/x")?, "/svc/internal/x");
//! assert_eq!(normalize("/caf%c3%a9/")?, "/caf%C3%A9/");
//! assert_eq!(normalize("/svc/a%2Fb").unwrap_err().kind(), PathErrorKind::EncodedSlash);
//! assert_eq!(normalize("/svc/../../etc").unwrap_err().kind(), PathErrorKind::AboveRoot);
//!
//! let uri = "http://gw.example/svc/%2e/x?next=/a/../b".parse()?;
//! let normal = normalize_uri(&uri)?.expect("changed");
//! assert_eq!(normal, "http://gw.example/svc/x?next=/a/../b");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::{borrow::Cow, fmt};

use http::{Uri, uri::PathAndQuery};

/// Why a path was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PathErrorKind {
    /// The path does not start with `/`.
    NotAbsolute,
    /// An encoded slash or backslash (`%2F`, `%5C`, either case).
    EncodedSlash,
    /// A raw backslash.
    Backslash,
    /// A NUL byte, raw or as `%00`.
    Nul,
    /// A `%` not followed by two hex digits.
    BadPercentEncoding,
    /// A dot segment with path parameters (`..;x`, `.;x`).
    DotSegmentWithParameters,
    /// A `..` segment with nothing left to remove: the path climbs above the root.
    AboveRoot,
    /// The normalised path could not be written back into a URI.
    Unparsable,
}

// === impl PathErrorKind ===

impl PathErrorKind {
    /// A short, stable name (`encoded_slash`, `above_root`, …), for logs and JSON bodies.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            PathErrorKind::NotAbsolute => "not_absolute",
            PathErrorKind::EncodedSlash => "encoded_slash",
            PathErrorKind::Backslash => "backslash",
            PathErrorKind::Nul => "nul",
            PathErrorKind::BadPercentEncoding => "bad_percent_encoding",
            PathErrorKind::DotSegmentWithParameters => "dot_segment_with_parameters",
            PathErrorKind::AboveRoot => "above_root",
            PathErrorKind::Unparsable => "unparsable",
        }
    }
}

impl fmt::Display for PathErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathErrorKind::NotAbsolute => "it does not start with `/`",
            PathErrorKind::EncodedSlash => "it holds an encoded slash (`%2F` or `%5C`)",
            PathErrorKind::Backslash => "it holds a backslash",
            PathErrorKind::Nul => "it holds a NUL byte",
            PathErrorKind::BadPercentEncoding => "it holds a `%` not followed by two hex digits",
            PathErrorKind::DotSegmentWithParameters => {
                "it holds a dot segment with parameters (`..;`)"
            }
            PathErrorKind::AboveRoot => "it climbs above the root",
            PathErrorKind::Unparsable => "it is not a valid URI path once normalised",
        })
    }
}

/// A path [`normalize`] rejects: what is wrong, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PathError {
    kind: PathErrorKind,
    offset: usize,
}

// === impl PathError ===

impl PathError {
    fn new(kind: PathErrorKind, offset: usize) -> Self {
        PathError { kind, offset }
    }

    /// What is wrong.
    #[must_use]
    pub fn kind(&self) -> PathErrorKind {
        self.kind
    }

    /// The byte offset in the input where the problem starts.
    #[must_use]
    pub fn offset(&self) -> usize {
        self.offset
    }
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "path rejected: {} (at byte {})", self.kind, self.offset)
    }
}

impl std::error::Error for PathError {}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The value of one hex digit, either case.
pub(crate) fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The byte an escape at `bytes[i]` (a `%`) encodes, or why it is rejected.
fn escape_at(bytes: &[u8], i: usize) -> Result<u8, PathError> {
    let (Some(h), Some(l)) = (
        bytes.get(i + 1).copied().and_then(hex),
        bytes.get(i + 2).copied().and_then(hex),
    ) else {
        return Err(PathError::new(PathErrorKind::BadPercentEncoding, i));
    };
    match (h << 4) | l {
        0 => Err(PathError::new(PathErrorKind::Nul, i)),
        b'/' | b'\\' => Err(PathError::new(PathErrorKind::EncodedSlash, i)),
        b => Ok(b),
    }
}

/// Whether `segment` is `.` or `..` followed by `;` parameters.
fn is_dot_with_parameters(segment: &[u8]) -> bool {
    matches!(segment.split(|&b| b == b';').next(), Some(b"." | b"..")) && segment.contains(&b';')
}

/// Normalises an absolute request path; see the [module docs](self).
///
/// Returns the input borrowed when it is already normal. Normalising a normal path changes
/// nothing, and a normal path holds no `//`, no `.` or `..` segment, and starts with `/`.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    if is_normal(path) {
        Ok(Cow::Borrowed(path))
    } else {
        normalize_owned(path).map(Cow::Owned)
    }
}

/// `true` when [`normalize`] returns `path` unchanged. One pass, no allocation.
#[must_use]
pub fn is_normal(path: &str) -> bool {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return false;
    }
    // Most paths hold no escape, no backslash, no NUL, and no `/` followed by `/` or `.`:
    // nothing to look at more closely.
    let mut previous = b'/';
    let plain = bytes[1..].iter().all(|&b| {
        let plain = match b {
            b'%' | b'\\' | 0 => false,
            b'/' | b'.' => previous != b'/',
            _ => true,
        };
        previous = b;
        plain
    });
    if plain {
        return true;
    }
    let mut segments = bytes[1..].split(|&b| b == b'/').peekable();
    while let Some(segment) = segments.next() {
        // An empty segment only as the whole path (`/`) or after a trailing slash.
        if segment.is_empty() {
            if segments.peek().is_some() {
                return false;
            }
            continue;
        }
        if matches!(segment, b"." | b"..") || is_dot_with_parameters(segment) {
            return false;
        }
        let mut i = 0;
        while i < segment.len() {
            match segment[i] {
                b'%' => {
                    let upper = |b: &u8| b.is_ascii_digit() || (b'A'..=b'F').contains(b);
                    if !segment
                        .get(i + 1..i + 3)
                        .is_some_and(|h| h.iter().all(upper))
                    {
                        return false;
                    }
                    match escape_at(segment, i) {
                        Ok(b) if !is_unreserved(b) => i += 3,
                        _ => return false,
                    }
                }
                0 | b'\\' => return false,
                _ => i += 1,
            }
        }
    }
    true
}

/// The allocating path of [`normalize`].
fn normalize_owned(path: &str) -> Result<String, PathError> {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::new(PathErrorKind::NotAbsolute, 0));
    }
    // `out` is `/` followed by every kept segment and its `/`.
    let mut out = String::with_capacity(path.len());
    out.push('/');
    let mut ends_as_directory = true;
    let mut start = 1;
    while start <= bytes.len() {
        let end = bytes[start..]
            .iter()
            .position(|&b| b == b'/')
            .map_or(bytes.len(), |p| start + p);
        let raw = &path[start..end];
        let next = end + 1;
        if raw.is_empty() {
            // `//` merges; a trailing `/` keeps the path a directory.
            ends_as_directory = true;
            start = next;
            continue;
        }
        let segment_at = out.len();
        push_decoded(raw, start, &mut out)?;
        let segment = &out.as_bytes()[segment_at..];
        match segment {
            b"." => {
                out.truncate(segment_at);
                ends_as_directory = true;
            }
            b".." => {
                out.truncate(segment_at);
                if segment_at == 1 {
                    return Err(PathError::new(PathErrorKind::AboveRoot, start));
                }
                // Drop the previous segment: back to the `/` before it.
                let previous = out[..segment_at - 1].rfind('/').map_or(1, |p| p + 1);
                out.truncate(previous);
                ends_as_directory = true;
            }
            s if is_dot_with_parameters(s) => {
                return Err(PathError::new(
                    PathErrorKind::DotSegmentWithParameters,
                    start,
                ));
            }
            _ => {
                out.push('/');
                ends_as_directory = false;
            }
        }
        start = next;
    }
    if !ends_as_directory && out.len() > 1 {
        out.pop();
    }
    Ok(out)
}

/// Appends `raw` (one segment, at `offset` in the input) to `out`, decoding unreserved
/// escapes and upper-casing the others.
fn push_decoded(raw: &str, offset: usize, out: &mut String) -> Result<(), PathError> {
    let bytes = raw.as_bytes();
    let mut run = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let b = escape_at(bytes, i).map_err(|e| PathError::new(e.kind, offset + i))?;
                // `raw[run..i]` ends before an ASCII byte: a char boundary.
                out.push_str(&raw[run..i]);
                if is_unreserved(b) {
                    out.push(char::from(b));
                } else {
                    const HEX: &[u8; 16] = b"0123456789ABCDEF";
                    out.push('%');
                    out.push(char::from(HEX[usize::from(b >> 4)]));
                    out.push(char::from(HEX[usize::from(b & 0xF)]));
                }
                i += 3;
                run = i;
            }
            0 => return Err(PathError::new(PathErrorKind::Nul, offset + i)),
            b'\\' => return Err(PathError::new(PathErrorKind::Backslash, offset + i)),
            _ => i += 1,
        }
    }
    out.push_str(&raw[run..]);
    Ok(())
}

/// Normalises the path of `uri`, keeping its scheme, authority and query as they are.
///
/// `Ok(None)` when nothing changes (the common case: no allocation), or when the path is
/// not absolute (`*` in `OPTIONS *`, a `CONNECT` authority), which has nothing to normalise.
pub fn normalize_uri(uri: &Uri) -> Result<Option<Uri>, PathError> {
    let path = uri.path();
    if !path.starts_with('/') {
        return Ok(None);
    }
    let Cow::Owned(mut normal) = normalize(path)? else {
        return Ok(None);
    };
    if let Some(query) = uri.query() {
        normal.push('?');
        normal.push_str(query);
    }
    let unparsable = |_| PathError::new(PathErrorKind::Unparsable, 0);
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::try_from(normal).map_err(unparsable)?);
    Uri::from_parts(parts)
        .map(Some)
        .map_err(|_| PathError::new(PathErrorKind::Unparsable, 0))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn kind(path: &str) -> PathErrorKind {
        normalize(path).expect_err(path).kind()
    }

    #[test]
    fn the_bypass_forms_of_issue_13() {
        for raw in [
            "/svc//internal/x",
            "/svc/x/../internal/x",
            "/svc/./internal/x",
            "/svc/%69nternal/x",
            "/svc/%2e/internal/x",
            "/svc/x/%2E%2E/internal/x",
            "//svc///internal//x",
        ] {
            assert_eq!(normalize(raw).unwrap(), "/svc/internal/x", "{raw}");
        }
    }

    #[test]
    fn rfc3986_dot_segments_and_slashes() {
        for (raw, normal) in [
            ("/", "/"),
            ("//", "/"),
            ("/.", "/"),
            ("/./", "/"),
            ("/a", "/a"),
            ("/a/", "/a/"),
            ("/a/.", "/a/"),
            ("/a/..", "/"),
            ("/a/b/..", "/a/"),
            ("/a/b/../", "/a/"),
            ("/a/b/../c", "/a/c"),
            ("/a/./b/./c/.", "/a/b/c/"),
            ("/a//..", "/"),
            ("/a/b/c/./../../g", "/a/g"),
            ("/mid/content=5/../6", "/mid/6"),
            ("/...", "/..."),
            ("/a/..b/c", "/a/..b/c"),
            ("/a/b.;c", "/a/b.;c"),
            ("/a;x/b", "/a;x/b"),
            ("/%7Euser/%41%62%2D%5f", "/~user/Ab-_"),
            ("/%3a%3B%25%c3%A9", "/%3A%3B%25%C3%A9"),
            ("/caf\u{e9}/", "/caf\u{e9}/"),
        ] {
            assert_eq!(normalize(raw).unwrap(), normal, "{raw}");
        }
    }

    #[test]
    fn rejections_name_the_kind_and_offset() {
        for (raw, expected) in [
            ("/a%2Fb", PathErrorKind::EncodedSlash),
            ("/a%2fb", PathErrorKind::EncodedSlash),
            ("/a%5Cb", PathErrorKind::EncodedSlash),
            ("/a%5cb", PathErrorKind::EncodedSlash),
            ("/a\\b", PathErrorKind::Backslash),
            ("/a%00", PathErrorKind::Nul),
            ("/a\0", PathErrorKind::Nul),
            ("/a%zz", PathErrorKind::BadPercentEncoding),
            ("/a%4", PathErrorKind::BadPercentEncoding),
            ("/a%", PathErrorKind::BadPercentEncoding),
            ("/a/..;/b", PathErrorKind::DotSegmentWithParameters),
            ("/a/.;x/b", PathErrorKind::DotSegmentWithParameters),
            ("/a/%2e%2e;/b", PathErrorKind::DotSegmentWithParameters),
            ("/..", PathErrorKind::AboveRoot),
            ("/a/../..", PathErrorKind::AboveRoot),
            ("/a/../../b", PathErrorKind::AboveRoot),
            ("//%2e%2e", PathErrorKind::AboveRoot),
            ("a/b", PathErrorKind::NotAbsolute),
            ("", PathErrorKind::NotAbsolute),
        ] {
            assert_eq!(kind(raw), expected, "{raw:?}");
        }
        let e = normalize("/svc/a%2Fb").unwrap_err();
        assert_eq!(e.offset(), 6);
        assert_eq!(
            e.to_string(),
            "path rejected: it holds an encoded slash (`%2F` or `%5C`) (at byte 6)"
        );
        assert_eq!(e.kind().as_str(), "encoded_slash");
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for path in ["/", "/a", "/a/", "/a/b.c/~d", "/%C3%A9", "/a;b=c/d", "/..."] {
            assert!(
                matches!(normalize(path), Ok(Cow::Borrowed(p)) if p == path),
                "{path}"
            );
        }
    }

    #[test]
    fn uris_keep_scheme_authority_and_query() {
        let uri: Uri = "/a/./b?x=/../%2F&y".parse().unwrap();
        assert_eq!(normalize_uri(&uri).unwrap().unwrap(), "/a/b?x=/../%2F&y");
        let uri: Uri = "/a/b?x=1".parse().unwrap();
        assert_eq!(normalize_uri(&uri).unwrap(), None);
        let uri: Uri = "*".parse().unwrap();
        assert_eq!(normalize_uri(&uri).unwrap(), None);
        let uri: Uri = "example.com:443".parse().unwrap();
        assert_eq!(normalize_uri(&uri).unwrap(), None);
        let uri: Uri = "https://h.example:8443//a".parse().unwrap();
        assert_eq!(
            normalize_uri(&uri).unwrap().unwrap(),
            "https://h.example:8443/a"
        );
        let uri: Uri = "/a/../..?q".parse().unwrap();
        assert_eq!(
            normalize_uri(&uri).unwrap_err().kind(),
            PathErrorKind::AboveRoot
        );
    }

    /// Paths rich in what normalisation cares about.
    fn tricky_path() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                Just("/".to_owned()),
                Just(".".to_owned()),
                Just("..".to_owned()),
                Just("%".to_owned()),
                Just(";".to_owned()),
                Just("%2e".to_owned()),
                Just("%2F".to_owned()),
                Just("%41".to_owned()),
                Just("%c3".to_owned()),
                Just("\\".to_owned()),
                "[a-z0-9]{1,3}",
                "[0-9a-fA-F]",
                any::<char>().prop_map(String::from),
            ],
            0..24,
        )
        .prop_map(|parts| parts.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Bounded smoke of the `path_normalize` fuzz target.
        #[test]
        fn normalising_is_idempotent_and_never_climbs(tail in tricky_path()) {
            let path = format!("/{tail}");
            match normalize(&path) {
                Ok(normal) => {
                    prop_assert!(normal.starts_with('/'));
                    prop_assert!(!normal.contains("//"), "{normal}");
                    prop_assert!(!normal.contains("/./") && !normal.ends_with("/."), "{normal}");
                    prop_assert!(!normal.contains("/../") && !normal.ends_with("/.."), "{normal}");
                    prop_assert!(is_normal(&normal), "{path} -> {normal}");
                    prop_assert_eq!(normalize(&normal).unwrap(), normal.clone());
                    prop_assert_eq!(is_normal(&path), normal == path);
                }
                Err(_) => prop_assert!(!is_normal(&path)),
            }
        }
    }
}
