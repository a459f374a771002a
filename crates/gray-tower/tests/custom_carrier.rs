//! A carrier written outside the workspace ([`CustomCarrier`]) through every layer: read by
//! `ExtractStainLayer`, written by `PropagateStainLayer`, read from trusted clients,
//! written for downstream and stripped from untrusted clients by the edge.

use std::{convert::Infallible, net::SocketAddr};

use gray_core::{
    Carriers, Lane, Names, Stain,
    codec::{Carrier, CustomCarrier, Decoded, Reason, Rejection},
};
use gray_rules::{CidrList, Format, RuleSet};
use gray_tower::{
    ExtractStainLayer, PropagateStainLayer,
    edge::{EdgeLayer, PeerAddr},
};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use tower::{Layer, ServiceExt, service_fn};

static X_CANARY: HeaderName = HeaderName::from_static("x-canary");

/// `x-canary: <lane>.ok`: the suffix shows a value went through this carrier.
#[derive(Debug)]
struct Canary;

impl CustomCarrier for Canary {
    fn header_name(&self) -> &HeaderName {
        &X_CANARY
    }

    fn decode(&self, headers: &HeaderMap, names: &Names) -> Result<Option<Decoded>, Rejection> {
        let Some(value) = headers.get(&X_CANARY) else {
            return Ok(None);
        };
        let lane = value
            .as_bytes()
            .strip_suffix(b".ok")
            .ok_or_else(|| Rejection::new(&X_CANARY, Reason::Other("no `.ok` suffix".into())))?;
        let lane = names
            .lane(lane)
            .map_err(|e| Rejection::new(&X_CANARY, Reason::InvalidName(e)))?;
        Ok(Some(Decoded::Lane(lane)))
    }

    fn encode(&self, stain: &Stain, headers: &mut HeaderMap) {
        let value = stain
            .lane()
            .and_then(|lane| HeaderValue::try_from(format!("{lane}.ok")).ok());
        match value {
            Some(value) => headers.insert(&X_CANARY, value),
            None => headers.remove(&X_CANARY),
        };
    }
}

/// Only the custom carrier: the default ones are left out on purpose.
fn carriers() -> Carriers {
    Carriers::new().with(Carrier::custom(Canary))
}

fn gray() -> Lane {
    Lane::new("gray").expect("lane")
}

/// Echoes what the service behind a layer saw: the stain and the `x-canary` header.
async fn seen(
    req: Request<()>,
) -> Result<Response<(Option<Stain>, Option<HeaderValue>)>, Infallible> {
    let stain = req.extensions().get::<Stain>().cloned();
    Ok(Response::new((
        stain,
        req.headers().get(&X_CANARY).cloned(),
    )))
}

#[tokio::test]
async fn extract_reads_it_and_propagate_writes_it() {
    let server = ExtractStainLayer::new()
        .with_carriers(carriers())
        .layer(service_fn(seen));
    let req = Request::builder()
        .header("x-canary", "Gray.ok")
        .body(())
        .expect("request");
    let (stain, _) = server
        .clone()
        .oneshot(req)
        .await
        .expect("served")
        .into_body();
    assert_eq!(stain, Some(Stain::in_lane(gray())));

    // Malformed: present, so unstained (not the default); nothing panics.
    let req = Request::builder()
        .header("x-canary", "gray")
        .body(())
        .expect("request");
    let (stain, _) = server.oneshot(req).await.expect("served").into_body();
    assert_eq!(stain, Some(Stain::baseline()));

    // Outbound: the stain in the extensions is written in this carrier's format, over a
    // forged copy.
    let client = PropagateStainLayer::new()
        .with_carriers(carriers())
        .layer(service_fn(seen));
    let mut req = Request::builder()
        .header("x-canary", "blue.ok")
        .body(())
        .expect("request");
    req.extensions_mut().insert(Stain::in_lane(gray()));
    let (_, header) = client.oneshot(req).await.expect("sent").into_body();
    assert_eq!(header.expect("written"), "gray.ok");
}

#[tokio::test]
async fn the_edge_strips_it_from_untrusted_clients_by_construction() {
    let rules = RuleSet::parse(
        r#"{"rules": [{"name": "beta", "when": {"header": {"name": "x-beta", "exact": "1"}}, "lane": "beta"}]}"#,
        Format::Json,
        "rules.json",
    )
    .expect("rules");
    let edge = EdgeLayer::new(rules)
        .with_carriers(carriers())
        .with_trusted_clients(CidrList::parse(["10.0.0.0/8"]).expect("cidrs"));
    assert!(edge.stripped_headers().contains(&X_CANARY));
    // Switching off the known headers leaves the configured carriers' headers stripped.
    let bare = edge.clone().with_strip_known(false);
    assert_eq!(bare.stripped_headers(), std::slice::from_ref(&X_CANARY));

    let send = |peer: &str, headers: &[(&str, &str)]| {
        let mut req = Request::builder().uri("/orders");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .extension(PeerAddr(peer.parse::<SocketAddr>().expect("peer")))
            .body(())
            .expect("request");
        edge.layer(service_fn(seen)).oneshot(req)
    };

    // An untrusted client's forged carrier is gone before the service sees the request.
    let res = send("203.0.113.9:5000", &[("x-canary", "gray.ok")]).await;
    let (stain, header) = res
        .expect("served")
        .into_body()
        .into_inner()
        .expect("the service answered, not the edge");
    assert_eq!(stain, Some(Stain::baseline()));
    assert_eq!(header, None, "the forged x-canary reached the service");

    // A trusted client's carrier is read, and written onward.
    let res = send("10.1.2.3:5000", &[("x-canary", "gray.ok")]).await;
    let (stain, header) = res
        .expect("served")
        .into_body()
        .into_inner()
        .expect("the service answered, not the edge");
    assert_eq!(stain, Some(Stain::in_lane(gray())));
    assert_eq!(header.expect("written"), "gray.ok");

    // A rule's decision is written in the custom format, over an untrusted forgery.
    let res = send(
        "203.0.113.9:5000",
        &[("x-canary", "gray.ok"), ("x-beta", "1")],
    )
    .await;
    let (stain, header) = res
        .expect("served")
        .into_body()
        .into_inner()
        .expect("the service answered, not the edge");
    assert_eq!(stain.expect("stained").lane().expect("lane"), "beta");
    assert_eq!(header.expect("written"), "beta.ok");
}
