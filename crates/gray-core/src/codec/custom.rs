//! [`CustomCarrier`]: a carrier written outside this crate, used through
//! [`Carrier::custom`](super::Carrier::custom) like the built-in ones.

use std::fmt;

use http::{HeaderMap, HeaderName};

use super::{Decoded, Rejection};
use crate::{name::Names, stain::Stain};

/// A way of carrying the stain in headers that this crate does not know: a header format
/// of your own (`x-canary: <lane>@<signature>`), another propagation standard.
///
/// Wrap it with [`Carrier::custom`](super::Carrier::custom) and add it to
/// [`Carriers`](super::Carriers) with [`Carriers::with`](super::Carriers::with): then
/// every layer that reads or writes those carriers uses it, in its place in the list
/// (gray-tower's `ExtractStainLayer` reads it, `PropagateStainLayer` writes it, the
/// edge reads it from trusted clients, writes it for the services behind and strips
/// [`header_names`](Self::header_names) from untrusted clients).
///
/// The contract, which the built-in carriers follow too:
///
/// - [`decode`](Self::decode) is lenient: `Ok(None)` when the carrier is absent, `Err`
///   when it is present but unusable (the request then counts as carrying it, unstained,
///   and a debug event names the [`Rejection`]); it never panics on what a client sent.
///   Intern lanes and versions through `names` ([`Names::lane`], [`Names::version`]): a
///   known name then costs no allocation.
/// - [`encode`](Self::encode) states the stain, replacing whatever the carrier held on the
///   request (a stale or forged copy included); a stain this carrier cannot express (a
///   baseline stain, another lane) removes it.
/// - [`header_names`](Self::header_names) names every header the carrier reads: an edge
///   removes those headers **whole** from an untrusted client's request, so name only
///   headers that belong to the stain.
///
/// ```
/// use gray_core::{
///     Carriers, Lane, Names, Stain,
///     codec::{Carrier, CustomCarrier, Decoded, Reason, Rejection},
/// };
/// use http::{HeaderMap, HeaderName, HeaderValue};
///
/// /// `x-tenant-lane: <lane>`, upper case on the wire.
/// #[derive(Debug)]
/// struct Shouted;
///
/// static HEADER: HeaderName = HeaderName::from_static("x-tenant-lane");
///
/// impl CustomCarrier for Shouted {
///     fn header_name(&self) -> &HeaderName {
///         &HEADER
///     }
///
///     fn decode(&self, headers: &HeaderMap, names: &Names) -> Result<Option<Decoded>, Rejection> {
///         let Some(value) = headers.get(&HEADER) else { return Ok(None) };
///         let lane = names
///             .lane(value.as_bytes())
///             .map_err(|e| Rejection::new(&HEADER, Reason::InvalidName(e)))?;
///         Ok(Some(Decoded::Lane(lane)))
///     }
///
///     fn encode(&self, stain: &Stain, headers: &mut HeaderMap) {
///         match stain.lane().and_then(|l| HeaderValue::from_str(&l.as_str().to_uppercase()).ok()) {
///             Some(value) => headers.insert(&HEADER, value),
///             None => headers.remove(&HEADER),
///         };
///     }
/// }
///
/// let carriers = Carriers::new().with(Carrier::custom(Shouted));
/// let mut inbound = HeaderMap::new();
/// inbound.insert("x-tenant-lane", HeaderValue::from_static("CANARY"));
/// let stain = carriers.extract(&inbound).unwrap();
/// assert_eq!(stain, Stain::in_lane(Lane::new("canary").unwrap()));
///
/// let mut outbound = HeaderMap::new();
/// carriers.inject(&stain, &mut outbound);
/// assert_eq!(outbound["x-tenant-lane"], "CANARY");
/// carriers.inject(&Stain::baseline(), &mut outbound);
/// assert!(outbound.is_empty());
/// ```
pub trait CustomCarrier: fmt::Debug + Send + Sync + 'static {
    /// The header this carrier lives in (the first of [`header_names`](Self::header_names)).
    fn header_name(&self) -> &HeaderName;

    /// Every header this carrier reads; by default [`header_name`](Self::header_name)
    /// alone. An edge strips these headers whole from untrusted clients.
    fn header_names(&self) -> &[HeaderName] {
        std::slice::from_ref(self.header_name())
    }

    /// Reads the carrier from `headers`: `Ok(None)` when it is absent, an error when it is
    /// present but unusable.
    ///
    /// # Errors
    ///
    /// A [`Rejection`] naming the header and the [`Reason`](super::Reason) (a custom
    /// carrier's own reason is [`Reason::Other`](super::Reason::Other)).
    fn decode(&self, headers: &HeaderMap, names: &Names) -> Result<Option<Decoded>, Rejection>;

    /// Writes `stain` into `headers`, replacing the carrier's previous value; removes the
    /// carrier when it cannot express the stain (a baseline stain, at least).
    fn encode(&self, stain: &Stain, headers: &mut HeaderMap);

    /// Removes the carrier from `headers`; by default every one of
    /// [`header_names`](Self::header_names).
    fn remove(&self, headers: &mut HeaderMap) {
        for name in self.header_names() {
            headers.remove(name);
        }
    }

    /// `true` when the carrier is present in `headers`, valid or not; by default when any
    /// of [`header_names`](Self::header_names) is.
    fn is_present(&self, headers: &HeaderMap) -> bool {
        self.header_names().iter().any(|n| headers.contains_key(n))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::HeaderValue;

    use super::*;
    use crate::{
        Carriers, Lane,
        codec::{Carrier, PlainHeader, Reason, X_GRAY_LANE},
    };

    /// `x-canary: <lane>!` (the `!` proves the value went through this carrier) and
    /// `x-canary-seen`, a second header it owns.
    #[derive(Debug)]
    struct Bang;

    const X_CANARY: HeaderName = HeaderName::from_static("x-canary");
    static NAMES: [HeaderName; 2] = [X_CANARY, HeaderName::from_static("x-canary-seen")];

    impl CustomCarrier for Bang {
        fn header_name(&self) -> &HeaderName {
            &NAMES[0]
        }

        fn header_names(&self) -> &[HeaderName] {
            &NAMES
        }

        fn decode(&self, headers: &HeaderMap, names: &Names) -> Result<Option<Decoded>, Rejection> {
            let Some(value) = headers.get(&X_CANARY) else {
                return Ok(None);
            };
            let Some(lane) = value.as_bytes().strip_suffix(b"!") else {
                return Err(Rejection::new(&X_CANARY, Reason::Other("no `!`".into())));
            };
            let lane = names
                .lane(lane)
                .map_err(|e| Rejection::new(&X_CANARY, Reason::InvalidName(e)))?;
            Ok(Some(Decoded::Lane(lane)))
        }

        fn encode(&self, stain: &Stain, headers: &mut HeaderMap) {
            match stain.lane() {
                Some(lane) => {
                    let value = format!("{lane}!");
                    headers.insert(X_CANARY, HeaderValue::try_from(value).unwrap());
                }
                None => {
                    headers.remove(X_CANARY);
                }
            }
        }
    }

    fn gray() -> Lane {
        Lane::new("gray").unwrap()
    }

    #[test]
    fn decodes_encodes_and_strips_in_its_place() {
        let carriers = Carriers::new().with(Carrier::custom(Bang));
        let mut h = HeaderMap::new();
        assert_eq!(carriers.extract(&h), None, "absent");
        assert!(!carriers.is_present(&h));

        h.insert(X_CANARY, HeaderValue::from_static("Gray!"));
        assert_eq!(carriers.extract(&h), Some(Stain::in_lane(gray())));

        // Present but malformed: counts as present, unstained, with the rejection.
        h.insert(X_CANARY, HeaderValue::from_static("gray"));
        let mut seen = Vec::new();
        let stain = carriers.extract_with(&h, |r| seen.push(r.to_string()));
        assert_eq!(stain, Some(Stain::baseline()));
        assert_eq!(seen, ["ignored header `x-canary`: no `!`"]);

        let mut out = HeaderMap::new();
        out.insert(X_CANARY, HeaderValue::from_static("forged!"));
        carriers.inject(&Stain::in_lane(gray()), &mut out);
        assert_eq!(out["x-canary"], "gray!", "the decision wins");
        carriers.inject(&Stain::baseline(), &mut out);
        assert!(out.get("x-canary").is_none(), "baseline removes it");

        // Strip removes every header it owns; other headers stay.
        out.insert(X_CANARY, HeaderValue::from_static("gray!"));
        out.insert("x-canary-seen", HeaderValue::from_static("1"));
        out.insert("x-other", HeaderValue::from_static("1"));
        assert!(carriers.is_present(&out));
        carriers.strip(&mut out);
        assert_eq!(out.len(), 1);
        assert!(out.contains_key("x-other"));
    }

    #[test]
    fn the_first_carrier_in_the_list_decides() {
        let custom_first = Carriers::new()
            .with(Carrier::custom(Bang))
            .with(PlainHeader::lane(X_GRAY_LANE));
        let plain_first = Carriers::new()
            .with(PlainHeader::lane(X_GRAY_LANE))
            .with(Carrier::custom(Bang));
        let mut h = HeaderMap::new();
        h.insert(X_CANARY, HeaderValue::from_static("gray!"));
        h.insert(X_GRAY_LANE, HeaderValue::from_static("blue"));
        assert_eq!(custom_first.extract(&h).unwrap().lane().unwrap(), "gray");
        assert_eq!(plain_first.extract(&h).unwrap().lane().unwrap(), "blue");
    }

    #[test]
    fn a_shared_carrier_is_one_value() {
        let shared: Arc<dyn CustomCarrier> = Arc::new(Bang);
        let carrier = Carrier::from(shared.clone());
        assert_eq!(carrier.header_name(), &X_CANARY);
        assert_eq!(carrier.header_names(), &NAMES);
        assert_eq!(Arc::strong_count(&shared), 2);
        assert!(format!("{carrier:?}").contains("Bang"));
    }
}
