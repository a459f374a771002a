//! Compiled conditions and their evaluation.

use http::HeaderName;
use regex::bytes::Regex;

use super::{
    cidr::{Cidr, CidrList},
    config::{ConditionConfig, FieldMatchConfig, KeyConfig, PathMatchConfig},
    error::{At, RulesError},
    hash::{BUCKETS, Dice, sticky_bucket},
    request::{RequestView, decoded_eq, decoded_starts_with, percent_decode},
};

/// The deepest nesting of `all` / `any` / `not` accepted (bounds recursion).
pub const MAX_DEPTH: usize = 32;

#[derive(Debug, Clone)]
pub(crate) enum Condition {
    Header(HeaderName, ValueMatch),
    Cookie(Box<str>, ValueMatch),
    Query(Box<str>, ValueMatch),
    Path(PathMatch),
    Ip(CidrList),
    Sticky {
        key: Key,
        threshold: u32,
        salt: Box<[u8]>,
    },
    Random(u32),
    All(Vec<Condition>),
    Any(Vec<Condition>),
    Not(Box<Condition>),
}

#[derive(Debug, Clone)]
pub(crate) enum ValueMatch {
    Exact(Box<[u8]>, bool),
    OneOf(Vec<Box<[u8]>>, bool),
    Prefix(Box<[u8]>, bool),
    Regex(Regex),
    Present(bool),
}

#[derive(Debug, Clone)]
pub(crate) enum PathMatch {
    Exact(Box<str>),
    Prefix(Box<str>),
    Segment(Box<str>),
    Regex(Regex),
}

#[derive(Debug, Clone)]
pub(crate) enum Key {
    Header(HeaderName),
    Cookie(Box<str>),
    Query(Box<str>),
    ClientIp,
}

fn eq(a: &[u8], b: &[u8], ignore_case: bool) -> bool {
    if ignore_case {
        a.eq_ignore_ascii_case(b)
    } else {
        a == b
    }
}

fn starts_with(a: &[u8], prefix: &[u8], ignore_case: bool) -> bool {
    a.len() >= prefix.len() && eq(&a[..prefix.len()], prefix, ignore_case)
}

// === impl ValueMatch ===

impl ValueMatch {
    /// Matches raw values (headers, cookies). `Present` is handled by the caller.
    fn raw(&self, value: &[u8]) -> bool {
        match self {
            ValueMatch::Exact(e, ic) => eq(value, e, *ic),
            ValueMatch::OneOf(list, ic) => list.iter().any(|e| eq(value, e, *ic)),
            ValueMatch::Prefix(p, ic) => starts_with(value, p, *ic),
            ValueMatch::Regex(re) => re.is_match(value),
            ValueMatch::Present(p) => *p,
        }
    }

    /// Matches a percent-encoded query value, decoding on the fly.
    fn encoded(&self, raw: &[u8]) -> bool {
        match self {
            ValueMatch::Exact(e, ic) => decoded_eq(raw, e, *ic),
            ValueMatch::OneOf(list, ic) => list.iter().any(|e| decoded_eq(raw, e, *ic)),
            ValueMatch::Prefix(p, ic) => decoded_starts_with(raw, p, *ic),
            ValueMatch::Regex(re) => re.is_match(&percent_decode(raw)),
            ValueMatch::Present(p) => *p,
        }
    }

    /// Matches the first value of a field (`None`: the field is absent). A field that
    /// appears more than once is read as its first value, never "any value matches".
    fn on_first(&self, value: Option<&[u8]>, encoded: bool) -> bool {
        match (self, value) {
            (ValueMatch::Present(want), value) => value.is_some() == *want,
            (_, None) => false,
            (m, Some(v)) if encoded => m.encoded(v),
            (m, Some(v)) => m.raw(v),
        }
    }
}

// === impl Condition ===

impl Condition {
    /// Whether evaluating this condition reads the client IP (`ip`, or `sticky` by it).
    pub(crate) fn reads_client_ip(&self) -> bool {
        match self {
            Condition::Ip(_) => true,
            Condition::Sticky { key, .. } => matches!(key, Key::ClientIp),
            Condition::All(list) | Condition::Any(list) => {
                list.iter().any(Condition::reads_client_ip)
            }
            Condition::Not(c) => c.reads_client_ip(),
            Condition::Header(..)
            | Condition::Cookie(..)
            | Condition::Query(..)
            | Condition::Path(_)
            | Condition::Random(_) => false,
        }
    }

    pub(crate) fn eval(&self, req: &RequestView<'_>, dice: &mut Option<Dice>) -> bool {
        match self {
            Condition::Header(name, m) => m.on_first(req.header(name), false),
            Condition::Cookie(name, m) => m.on_first(req.cookie(name), false),
            Condition::Query(name, m) => m.on_first(req.query_params(name).next(), true),
            Condition::Path(p) => {
                let path = req.path();
                match p {
                    PathMatch::Exact(e) => path == &**e,
                    PathMatch::Prefix(pre) => path.starts_with(&**pre),
                    PathMatch::Segment(s) => path.split('/').any(|seg| seg == &**s),
                    PathMatch::Regex(re) => re.is_match(path.as_bytes()),
                }
            }
            Condition::Ip(list) => req.client_ip().is_some_and(|ip| list.contains(ip)),
            Condition::Sticky {
                key,
                threshold,
                salt,
            } => key
                .bucket(req, salt)
                .is_some_and(|bucket| bucket < *threshold),
            Condition::Random(threshold) => {
                dice.get_or_insert_with(Dice::from_thread).roll(BUCKETS) < *threshold
            }
            Condition::All(list) => list.iter().all(|c| c.eval(req, dice)),
            Condition::Any(list) => list.iter().any(|c| c.eval(req, dice)),
            Condition::Not(c) => !c.eval(req, dice),
        }
    }
}

// === impl Key ===

impl Key {
    /// The user's bucket, or `None` when the key is missing (the user is not in).
    pub(crate) fn bucket(&self, req: &RequestView<'_>, salt: &[u8]) -> Option<u32> {
        self.with_bytes(req, |key| sticky_bucket(salt, key))
    }

    /// `f` of the key's bytes (a header's or cookie's first value, a query parameter
    /// decoded, the client IP's octets), or `None` when the request has no key.
    pub(crate) fn with_bytes<R>(
        &self,
        req: &RequestView<'_>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        match self {
            Key::Header(name) => req.header(name).map(f),
            Key::Cookie(name) => req.cookie(name).map(f),
            Key::Query(name) => req.query_param(name).map(|v| f(&v)),
            Key::ClientIp => req.client_ip().map(|ip| match ip {
                std::net::IpAddr::V4(v4) => f(&v4.octets()),
                std::net::IpAddr::V6(v6) => f(&v6.octets()),
            }),
        }
    }
}

/// Turns a percentage into basis points: 0 to 100 in steps of 0.01.
pub(crate) fn basis_points(at: &At<'_>, field: &str, percent: f64) -> Result<u32, RulesError> {
    if !percent.is_finite() || !(0.0..=100.0).contains(&percent) {
        return Err(at.expected(
            field,
            "a percentage from 0 to 100",
            Some(percent.to_string()),
        ));
    }
    // In range, so the product is in [0, 10000] and fits in u32.
    Ok((percent * 100.0).round() as u32)
}

pub(crate) fn header_name(at: &At<'_>, field: &str, name: &str) -> Result<HeaderName, RulesError> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| at.expected(field, "a valid HTTP header name", Some(format!("{name:?}"))))
}

pub(crate) fn compile_regex(at: &At<'_>, field: &str, pattern: &str) -> Result<Regex, RulesError> {
    regex::bytes::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| {
            at.expected(
                field,
                "a valid regular expression",
                Some(format!("{pattern:?} ({})", one_line(&e.to_string()))),
            )
        })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Checks that `name` (the value of `field`) is not empty; `what` it should be otherwise.
pub(crate) fn non_empty(
    at: &At<'_>,
    field: &str,
    name: &str,
    what: &'static str,
) -> Result<(), RulesError> {
    if name.is_empty() {
        Err(at.expected(field, what, Some("an empty string".into())))
    } else {
        Ok(())
    }
}

fn compile_value(at: &At<'_>, field: &str, c: &FieldMatchConfig) -> Result<ValueMatch, RulesError> {
    at.exactly_one(
        field,
        &[
            ("exact", c.exact.is_some()),
            ("one_of", c.one_of.is_some()),
            ("prefix", c.prefix.is_some()),
            ("regex", c.regex.is_some()),
            ("present", c.present.is_some()),
        ],
    )?;
    let ic = c.ignore_case;
    let bytes = |s: &str| Box::<[u8]>::from(s.as_bytes());
    Ok(if let Some(e) = &c.exact {
        ValueMatch::Exact(bytes(e), ic)
    } else if let Some(list) = &c.one_of {
        if list.is_empty() {
            return Err(at.expected(
                format!("{field}.one_of"),
                "at least one value",
                Some("an empty list".into()),
            ));
        }
        ValueMatch::OneOf(list.iter().map(|s| bytes(s)).collect(), ic)
    } else if let Some(p) = &c.prefix {
        ValueMatch::Prefix(bytes(p), ic)
    } else if let Some(re) = &c.regex {
        ValueMatch::Regex(compile_regex(at, &format!("{field}.regex"), re)?)
    } else {
        ValueMatch::Present(c.present.unwrap_or(true))
    })
}

fn compile_path(at: &At<'_>, field: &str, c: &PathMatchConfig) -> Result<PathMatch, RulesError> {
    at.exactly_one(
        field,
        &[
            ("exact", c.exact.is_some()),
            ("prefix", c.prefix.is_some()),
            ("segment", c.segment.is_some()),
            ("regex", c.regex.is_some()),
        ],
    )?;
    Ok(if let Some(e) = &c.exact {
        PathMatch::Exact(e.as_str().into())
    } else if let Some(p) = &c.prefix {
        PathMatch::Prefix(p.as_str().into())
    } else if let Some(s) = &c.segment {
        if s.is_empty() || s.contains('/') {
            return Err(at.expected(
                format!("{field}.segment"),
                "one non-empty path segment without `/` (such as `v1`)",
                Some(format!("{s:?}")),
            ));
        }
        PathMatch::Segment(s.as_str().into())
    } else {
        let re = c.regex.as_deref().unwrap_or_default();
        PathMatch::Regex(compile_regex(at, &format!("{field}.regex"), re)?)
    })
}

pub(crate) fn compile_key(at: &At<'_>, field: &str, k: &KeyConfig) -> Result<Key, RulesError> {
    Ok(match k {
        KeyConfig::Header(name) => Key::Header(header_name(at, &format!("{field}.header"), name)?),
        KeyConfig::Cookie(name) => {
            non_empty(at, &format!("{field}.cookie"), name, "a cookie name")?;
            Key::Cookie(name.as_str().into())
        }
        KeyConfig::Query(name) => {
            non_empty(
                at,
                &format!("{field}.query"),
                name,
                "a query parameter name",
            )?;
            Key::Query(name.as_str().into())
        }
        KeyConfig::ClientIp => Key::ClientIp,
    })
}

pub(crate) fn compile(
    at: &At<'_>,
    field: &str,
    c: &ConditionConfig,
    depth: usize,
) -> Result<Condition, RulesError> {
    if depth > MAX_DEPTH {
        return Err(at.expected(field, "conditions nested at most 32 deep", None));
    }
    let mut parts = Vec::new();
    if let Some(h) = &c.header {
        let f = format!("{field}.header");
        let name = header_name(at, &format!("{f}.name"), &h.name)?;
        parts.push(Condition::Header(name, compile_value(at, &f, h)?));
    }
    type Named = fn(Box<str>, ValueMatch) -> Condition;
    let named: [(&str, &Option<FieldMatchConfig>, &'static str, Named); 2] = [
        ("cookie", &c.cookie, "a cookie name", Condition::Cookie),
        (
            "query",
            &c.query,
            "a query parameter name",
            Condition::Query,
        ),
    ];
    for (key, config, what, condition) in named {
        let Some(m) = config else { continue };
        let f = format!("{field}.{key}");
        non_empty(at, &format!("{f}.name"), &m.name, what)?;
        parts.push(condition(m.name.as_str().into(), compile_value(at, &f, m)?));
    }
    if let Some(p) = &c.path {
        parts.push(Condition::Path(compile_path(
            at,
            &format!("{field}.path"),
            p,
        )?));
    }
    if let Some(ips) = &c.ip {
        let mut list = CidrList::new();
        for (i, s) in ips.iter().enumerate() {
            let cidr: Cidr = s.parse().map_err(|_| {
                at.expected(
                    format!("{field}.ip[{i}]"),
                    "a CIDR block (`10.0.0.0/8`) or an IP address",
                    Some(format!("{s:?}")),
                )
            })?;
            list.push(cidr);
        }
        if list.is_empty() {
            return Err(at.expected(
                format!("{field}.ip"),
                "at least one CIDR block or address",
                Some("an empty list".into()),
            ));
        }
        parts.push(Condition::Ip(list));
    }
    if let Some(s) = &c.sticky {
        let f = format!("{field}.sticky");
        parts.push(Condition::Sticky {
            key: compile_key(at, &format!("{f}.by"), &s.by)?,
            threshold: basis_points(at, &format!("{f}.percent"), s.percent)?,
            salt: s.salt.as_bytes().into(),
        });
    }
    if let Some(r) = &c.random {
        parts.push(Condition::Random(basis_points(
            at,
            &format!("{field}.random.percent"),
            r.percent,
        )?));
    }
    for (key, list) in [("all", &c.all), ("any", &c.any)] {
        let Some(list) = list else { continue };
        if list.is_empty() {
            return Err(at.expected(
                format!("{field}.{key}"),
                "at least one condition",
                Some("an empty list".into()),
            ));
        }
        let compiled = list
            .iter()
            .enumerate()
            .map(|(i, c)| compile(at, &format!("{field}.{key}[{i}]"), c, depth + 1))
            .collect::<Result<Vec<_>, _>>()?;
        parts.push(if key == "all" {
            Condition::All(compiled)
        } else {
            Condition::Any(compiled)
        });
    }
    if let Some(n) = &c.not {
        parts.push(Condition::Not(Box::new(compile(
            at,
            &format!("{field}.not"),
            n,
            depth + 1,
        )?)));
    }
    match parts.len() {
        0 => Err(at.expected(
            field,
            "at least one of `header`, `cookie`, `query`, `path`, `ip`, `sticky`, `random`, `all`, `any` or `not`",
            Some("none".into()),
        )),
        1 => Ok(parts.remove(0)),
        _ => Ok(Condition::All(parts)),
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, Uri};

    use crate::{Format, RequestView, RuleSet};

    fn rule(cond: &str) -> RuleSet {
        RuleSet::parse(
            &format!(r#"{{"rules":[{{"when":{cond},"lane":"gray"}}]}}"#),
            Format::Json,
            "test.json",
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn fires(rules: &RuleSet, uri: &str, headers: &[(&str, &'static str)]) -> bool {
        let uri: Uri = uri.parse().unwrap();
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_static(v),
            );
        }
        rules.evaluate(&RequestView::new(&uri, &h)).is_some()
    }

    #[test]
    fn a_duplicated_header_is_read_as_its_first_value() {
        let gray = rule(r#"{"header":{"name":"gray","exact":"true","ignore_case":true}}"#);
        assert!(!fires(&gray, "/", &[("gray", "false"), ("gray", "true")]));
        assert!(fires(&gray, "/", &[("gray", "true"), ("gray", "false")]));
        let one_of = rule(r#"{"header":{"name":"x-user","one_of":["alice"]}}"#);
        assert!(!fires(
            &one_of,
            "/",
            &[("x-user", "bob"), ("x-user", "alice")]
        ));
        let regex = rule(r#"{"header":{"name":"x-user","regex":"^a"}}"#);
        assert!(!fires(
            &regex,
            "/",
            &[("x-user", "bob"), ("x-user", "alice")]
        ));
        // `not` of a first value: the later value does not sneak back in.
        let not = rule(r#"{"not":{"header":{"name":"gray","exact":"false"}}}"#);
        assert!(!fires(&not, "/", &[("gray", "false"), ("gray", "true")]));
        let present = rule(r#"{"header":{"name":"gray","present":true}}"#);
        assert!(fires(&present, "/", &[("gray", ""), ("gray", "true")]));
    }

    #[test]
    fn a_duplicated_cookie_or_query_parameter_is_read_as_its_first_value() {
        let cookie = rule(r#"{"cookie":{"name":"beta","exact":"1"}}"#);
        assert!(!fires(&cookie, "/", &[("cookie", "beta=0; beta=1")]));
        assert!(!fires(
            &cookie,
            "/",
            &[("cookie", "beta=0"), ("cookie", "beta=1")]
        ));
        assert!(fires(&cookie, "/", &[("cookie", "a=2; beta=1; beta=0")]));
        let query = rule(r#"{"query":{"name":"gray","exact":"true"}}"#);
        assert!(!fires(&query, "/?gray=false&gray=true", &[]));
        assert!(fires(&query, "/?gray=true&gray=false", &[]));
        assert!(fires(&query, "/?g%72ay=tru%65&gray=false", &[]));
    }
}
