//! What an [`EdgeLayer`](super::EdgeLayer) is configured with, shared by every [`Edge`](super::Edge)
//! it builds; and what the edge strips from untrusted clients.

use gray_core::{
    Carrier, Carriers, Lane,
    carriers_config::{GRAY, VERSION, default_member},
    codec::{X_GRAY_INFO, X_GRAY_LANE},
};
use gray_rules::CidrList;
use http::{HeaderMap, HeaderName};

use std::sync::Arc;

use super::{client_ip::ClientIpResolver, live::LiveRules, refusal::Notices};

/// Seed 003's flag header, `x-gray-flag: true|false`.
pub const X_GRAY_FLAG: HeaderName = HeaderName::from_static("x-gray-flag");
/// Seed 003's client IP header, `x-gray-ip`.
pub const X_GRAY_IP: HeaderName = HeaderName::from_static("x-gray-ip");

/// The headers every carrier gray knows lives in, stripped from untrusted clients by
/// default (besides the stain's `baggage` member under
/// [`DEFAULT_BAGGAGE_KEY`](gray_core::codec::DEFAULT_BAGGAGE_KEY)): the lane
/// header, seed 002's route header, seed 003's flag and IP headers, seed 000's `gray` flag
/// and seed 001's `version`.
///
/// A slice, so that a release may add a header without breaking code that reads it. (The
/// headers of the carriers an edge is configured with, a
/// [`CustomCarrier`](gray_core::codec::CustomCarrier)'s included, are stripped whatever
/// this list holds.)
pub static KNOWN_STAIN_HEADERS: &[HeaderName] = &KNOWN;

static KNOWN: [HeaderName; 6] = [
    X_GRAY_LANE,
    X_GRAY_INFO,
    X_GRAY_FLAG,
    X_GRAY_IP,
    GRAY,
    VERSION,
];

const BAGGAGE: HeaderName = HeaderName::from_static("baggage");

/// Which decides first when a trusted client sends a stain and a rule also matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Precedence {
    /// The first matching rule decides; a trusted client's stain decides only when no rule
    /// matches (the default).
    #[default]
    RulesFirst,
    /// A trusted client's stain decides when it sends one; rules decide otherwise.
    InboundFirst,
}

/// The edge's configuration. Cloned only when a builder setter runs on a shared layer.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) rules: LiveRules,
    pub(crate) carriers: Carriers,
    pub(crate) resolver: ClientIpResolver,
    pub(crate) trusted_clients: CidrList,
    pub(crate) precedence: Precedence,
    pub(crate) seed003: Option<Lane>,
    pub(crate) strip_known: bool,
    pub(crate) strip: Vec<HeaderName>,
    pub(crate) hop_by_hop: bool,
    pub(crate) normalize_paths: bool,
    pub(crate) reject_prefix_escape: bool,
    pub(crate) forwarded_for: bool,
    pub(crate) decision_extension: bool,
    pub(crate) task_local: bool,
    /// Derived from `carriers`, `strip_known` and `strip` by [`Config::refresh`].
    pub(crate) removal: Removal,
    /// What has been logged once (shared by the layer's clones and its services).
    pub(crate) notices: Arc<Notices>,
}

impl Config {
    pub(crate) fn new(rules: LiveRules) -> Self {
        let mut config = Config {
            rules,
            carriers: Carriers::default(),
            resolver: ClientIpResolver::default(),
            trusted_clients: CidrList::new(),
            precedence: Precedence::default(),
            seed003: None,
            strip_known: true,
            strip: Vec::new(),
            hop_by_hop: true,
            normalize_paths: true,
            reject_prefix_escape: false,
            forwarded_for: false,
            decision_extension: true,
            task_local: true,
            removal: Removal::default(),
            notices: Arc::default(),
        };
        config.refresh();
        config
    }

    /// Recomputes what is stripped from untrusted clients: whatever a configured carrier
    /// reads (a custom carrier: every one of its headers, whole), the known carriers
    /// (unless switched off) and the extra headers.
    pub(crate) fn refresh(&mut self) {
        let mut removal = Removal::default();
        for carrier in self.carriers.iter() {
            match carrier {
                Carrier::Custom(custom) => {
                    for name in custom.header_names() {
                        removal.add_header(name.clone());
                    }
                }
                other => removal.add(other.clone()),
            }
        }
        if self.strip_known {
            for name in KNOWN_STAIN_HEADERS {
                removal.add_header(name.clone());
            }
            removal.add(Carrier::Baggage(default_member()));
        }
        for name in &self.strip {
            removal.add_header(name.clone());
        }
        self.removal = removal;
    }
}

/// What the edge removes from an untrusted client's request: whole headers, and members
/// of `baggage` (whose other members stay). No duplicates.
///
/// A header is removed under every name a server may map onto it: HTTP names are
/// case-insensitive already, and CGI-style servers read every byte that is not a letter or
/// a digit as `_` (WSGI's `HTTP_X_GRAY_LANE` for `x_gray_lane` and `x.gray.lane` alike,
/// nginx with `underscores_in_headers on`, Apache's environment), so `x_gray_lane` is
/// removed with `x-gray-lane`. A `baggage` member is removed under every spelling of its
/// key that a lenient decoder reads as the key
/// ([`BaggageMember::reads_as_key`](gray_core::codec::BaggageMember::reads_as_key)).
#[derive(Debug, Clone, Default)]
pub(crate) struct Removal {
    headers: Vec<HeaderName>,
    members: Vec<Carrier>,
    /// Bit `n` is set when a name of length `n` (below 64) is removed: most of a request's
    /// header names are passed over on their length alone.
    lengths: u64,
}

/// The bit of a name's length in [`Removal::lengths`] (names of 63 bytes or more share one).
fn length_bit(name: &HeaderName) -> u64 {
    1 << name.as_str().len().min(63)
}

impl Removal {
    fn add(&mut self, carrier: Carrier) {
        match &carrier {
            Carrier::Baggage(member) => {
                let known = self.members.iter().any(|c| match c {
                    Carrier::Baggage(m) => m.key() == member.key(),
                    _ => false,
                });
                if !known {
                    self.lengths |= length_bit(&BAGGAGE);
                    self.members.push(carrier);
                }
            }
            other => self.add_header(other.header_name().clone()),
        }
    }

    fn add_header(&mut self, name: HeaderName) {
        if !self.headers.contains(&name) {
            self.lengths |= length_bit(&name);
            self.headers.push(name);
        }
    }

    /// Another name of a removed header to a CGI-style server (`x_gray_lane`), if `name` is
    /// one and is not the header's own name.
    fn is_other_spelling(&self, name: &HeaderName) -> bool {
        self.headers
            .iter()
            .any(|h| h != name && same_cgi_name(h.as_str(), name.as_str()))
    }

    /// Removes what it names from `headers`. One pass over the request's header names
    /// decides whether there is anything to do (usually not).
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        let baggage = !self.members.is_empty();
        let (mut hit, mut other_spellings) = (false, false);
        for k in headers.keys() {
            if self.lengths & length_bit(k) == 0 {
                continue;
            }
            if self.headers.contains(k) || (baggage && *k == BAGGAGE) {
                hit = true;
            } else if self.is_other_spelling(k) {
                other_spellings = true;
            }
        }
        if !hit && !other_spellings {
            return;
        }
        for name in &self.headers {
            headers.remove(name);
        }
        if other_spellings {
            // Rare (a client trying them): the names are collected, then removed.
            let names: Vec<HeaderName> = headers
                .keys()
                .filter(|k| self.is_other_spelling(k))
                .cloned()
                .collect();
            for name in names {
                headers.remove(name);
            }
        }
        for member in &self.members {
            member.remove(headers);
        }
    }

    /// The whole headers removed, in order.
    pub(crate) fn headers(&self) -> &[HeaderName] {
        &self.headers
    }

    /// The `baggage` member keys removed, in order.
    pub(crate) fn baggage_keys(&self) -> impl Iterator<Item = &str> {
        self.members.iter().filter_map(|c| match c {
            Carrier::Baggage(m) => Some(m.key()),
            _ => None,
        })
    }
}

/// `true` when `a` and `b` (lowercase, as `HeaderName`s are) name the same CGI
/// meta-variable: the same letters and digits, any other byte in the same places.
fn same_cgi_name(a: &str, b: &str) -> bool {
    let cgi = |b: u8| if b.is_ascii_alphanumeric() { b } else { b'_' };
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| cgi(x) == cgi(y))
}

#[cfg(test)]
mod tests {
    use gray_core::codec::{BaggageMember, DEFAULT_BAGGAGE_KEY, PlainHeader};
    use gray_rules::RuleSet;
    use http::HeaderValue;

    use super::*;

    fn names(config: &Config) -> Vec<&str> {
        config
            .removal
            .headers()
            .iter()
            .map(|h| h.as_str())
            .collect()
    }

    #[test]
    fn the_default_strip_set_is_every_known_carrier() {
        let config = Config::new(LiveRules::new(RuleSet::default()));
        let names = names(&config);
        assert_eq!(
            names,
            [
                "x-gray-lane",
                "x-gray-info",
                "x-gray-flag",
                "x-gray-ip",
                "gray",
                "version"
            ]
        );
        assert_eq!(
            config.removal.baggage_keys().collect::<Vec<_>>(),
            [DEFAULT_BAGGAGE_KEY]
        );
    }

    #[test]
    fn configured_carriers_and_extras_join_without_duplicates() {
        let mut config = Config::new(LiveRules::new(RuleSet::default()));
        config.carriers = Carriers::new()
            .with(PlainHeader::lane(HeaderName::from_static("x-lane")))
            .with(PlainHeader::lane(X_GRAY_LANE))
            .with(BaggageMember::new("lane").unwrap())
            .with(BaggageMember::new(DEFAULT_BAGGAGE_KEY).unwrap());
        config.strip = vec![HeaderName::from_static("x-tenant"), GRAY];
        config.strip_known = false;
        config.refresh();
        let names = names(&config);
        assert_eq!(names, ["x-lane", "x-gray-lane", "x-tenant", "gray"]);
        assert_eq!(
            config.removal.baggage_keys().collect::<Vec<_>>(),
            ["lane", "gray.lane"]
        );

        let mut h = HeaderMap::new();
        h.insert("x-lane", HeaderValue::from_static("a"));
        h.insert("version", HeaderValue::from_static("2.0"));
        h.insert(
            "baggage",
            HeaderValue::from_static("lane=a,k=v,gray.lane=b"),
        );
        config.removal.apply(&mut h);
        assert!(!h.contains_key("x-lane"));
        assert_eq!(h["version"], "2.0", "not known-stripped when switched off");
        assert_eq!(h["baggage"], "k=v");
    }

    #[test]
    fn other_spellings_of_a_stripped_header_go_too() {
        let config = Config::new(LiveRules::new(RuleSet::default()));
        let mut h = HeaderMap::new();
        for name in [
            "x_gray_lane",
            "x.gray.lane",
            "x_gray-lane",
            "X_GRAY_INFO",
            "x~gray~flag",
            "x-gray-lane",
            "x-gray-lanes",
            "x-tenant",
            "x_tenant",
        ] {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static("gray"),
            );
        }
        config.removal.apply(&mut h);
        let mut left: Vec<_> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["x-gray-lanes", "x-tenant", "x_tenant"]);

        // An odd spelling alone is enough to start the removal.
        let mut h = HeaderMap::new();
        h.insert("x_gray_lane", HeaderValue::from_static("gray"));
        h.insert("accept", HeaderValue::from_static("*/*"));
        config.removal.apply(&mut h);
        assert_eq!(
            h.keys().map(HeaderName::as_str).collect::<Vec<_>>(),
            ["accept"]
        );
    }

    #[test]
    fn every_spelling_of_the_baggage_key_goes() {
        let config = Config::new(LiveRules::new(RuleSet::default()));
        for key in [
            "gray%2Elane",
            "Gray.Lane",
            "gray.lane+",
            "%20gray.lane",
            "gray%252elane",
        ] {
            let mut h = HeaderMap::new();
            h.insert(
                "baggage",
                HeaderValue::from_str(&format!("userId=42,{key}=gray")).unwrap(),
            );
            config.removal.apply(&mut h);
            assert_eq!(h["baggage"], "userId=42", "{key}");
        }
    }
}
