//! A balancer over HTTPS instances speaking HTTP/2 (gray-discovery's `HttpEndpoints` with
//! `Tls` and `Protocol::Http2`), without the gateway: routed by stain, and an instance
//! whose certificate is not trusted fails its handshake, counts as a connection error and
//! is ejected.

use std::time::Duration;

use bytes::Bytes;
use gray_balance::{
    BalanceLayer,
    health::{Ejection, Failure, classify},
};
use gray_core::{Labels, Lane, Stain, backoff::Backoff};
use gray_discovery::{
    Instance, StaticDiscover,
    http::{HttpEndpoints, Protocol, Tls},
};
use gray_policy::Policy;
use gray_test_support::{
    WAIT,
    https::{Upstream, client_config, server_config},
    tls::{Ca, Leaf},
};
use http_body_util::{BodyExt, Empty};
use tower::{BoxError, Layer, Service, ServiceExt};

fn instance(id: &str, upstream: &Upstream, gray: bool) -> Instance {
    let labels = if gray {
        Labels::from_iter([("gray", "true")])
    } else {
        Labels::new()
    };
    Instance::new(
        id.parse().unwrap(),
        format!("https://{}", upstream.addr()).parse().unwrap(),
        labels,
    )
}

#[tokio::test]
async fn https_h2_instances_are_balanced_by_stain_and_an_untrusted_one_is_ejected() {
    let ca = Ca::new("test CA");
    let cert = ca.issue(&Leaf::server(&["127.0.0.1"]));
    let stranger = Ca::new("another CA").issue(&Leaf::server(&["127.0.0.1"]));
    let gray = Upstream::start("gray-1", Some(server_config(&cert, None))).await;
    let base = Upstream::start("base-1", Some(server_config(&cert, None))).await;
    let bad = Upstream::start("gray-bad", Some(server_config(&stranger, None))).await;

    let config = client_config(&ca, None);
    let endpoints = HttpEndpoints::<_, Empty<Bytes>>::new()
        .with_tls(Tls::new(config))
        .with_protocol(Protocol::Http2)
        .discover(StaticDiscover::new([
            instance("gray-1", &gray, true),
            instance("gray-bad", &bad, true),
            instance("base-1", &base, false),
        ]));
    let backoff = Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
    let mut balance = BalanceLayer::new("svc", Policy::seed_000())
        .with_ejection(Ejection::new().with_consecutive(1).with_backoff(backoff))
        .layer(endpoints);

    let mut send = async |stain: Stain| -> Result<String, BoxError> {
        let mut request = http::Request::get("/x").body(Empty::new()).unwrap();
        request.extensions_mut().insert(stain);
        let response = balance.ready().await?.call(request).await?;
        let body = response.into_body().collect().await?.to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    };
    let lane = Stain::in_lane(Lane::new("gray").unwrap());
    let mut failures = 0;
    for _ in 0..40 {
        match send(lane.clone()).await {
            Ok(body) => assert_eq!(body, "gray-1 HTTP/2.0 /x lane=-"),
            Err(e) => {
                // The handshake failed: the request was handed back, nothing was sent.
                assert_eq!(classify(&*e), Failure::Unsent, "{e}");
                assert!(e.to_string().contains("UnknownIssuer"), "{e}");
                failures += 1;
            }
        }
    }
    assert!(
        (1..=2).contains(&failures),
        "picked until ejected: {failures}"
    );
    assert_eq!(
        send(Stain::baseline()).await.unwrap(),
        "base-1 HTTP/2.0 /x lane=-"
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while balance.ready_len() != 2 {
        assert!(tokio::time::Instant::now() < deadline, "not ejected");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(bad.handshakes(), 0);
    assert_eq!(
        (gray.accepted(), base.accepted()),
        (1, 1),
        "one HTTP/2 connection each"
    );
}
