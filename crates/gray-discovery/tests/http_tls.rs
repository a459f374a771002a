//! HTTPS and HTTP/2 instances (feature `tls`): real rustls servers on loopback, with
//! certificates from a test CA.

mod support;

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::future::join_all;
use gray_core::unsent::Unsent;
use gray_discovery::{
    Instance,
    http::{HttpEndpoint, HttpEndpoints, Protocol, RequestError, Tls, rustls},
};
use gray_test_support::{
    WAIT,
    https::{Upstream, client_config, server_config},
    tls::{Ca, Leaf},
};
use http::Request;
use http_body_util::{BodyExt, Empty};
use rustls::pki_types::ServerName;
use tower::{BoxError, ServiceExt};

type Endpoints = HttpEndpoints<gray_discovery::http::Connector, Empty<Bytes>>;

fn endpoint(
    endpoints: &Endpoints,
    address: String,
) -> HttpEndpoint<gray_discovery::http::Connector, Empty<Bytes>> {
    endpoints.endpoint(support::instance("a", address, &[]))
}

/// The body of the answer to `GET path`, or the error.
async fn get(
    endpoint: &HttpEndpoint<gray_discovery::http::Connector, Empty<Bytes>>,
    path: &str,
) -> Result<String, BoxError> {
    let request = Request::get(path).body(Empty::new()).unwrap();
    let response = tokio::time::timeout(WAIT, endpoint.clone().oneshot(request))
        .await
        .expect("an answer within the bound")?;
    let body = response.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The `RequestError` in `error`'s chain.
fn request_error(error: &BoxError) -> &RequestError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&**error);
    while let Some(e) = cause {
        if let Some(found) = e.downcast_ref::<RequestError>() {
            return found;
        }
        cause = e.source();
    }
    panic!("no RequestError in {error}")
}

#[tokio::test]
async fn https_instances_are_verified_and_alpn_picks_the_protocol() {
    let ca = Ca::new("test CA");
    let cert = ca.issue(&Leaf::server(&["127.0.0.1"]));
    let upstream = Upstream::start("a", Some(server_config(&cert, None))).await;
    let address = format!("https://{}", upstream.addr());
    let tls = Tls::new(client_config(&ca, None));

    // HTTP/1.1 (ALPN `http/1.1`), HTTP/2 (ALPN `h2`), and what the instance prefers (h2).
    for (protocol, version) in [
        (Protocol::Http1, "HTTP/1.1"),
        (Protocol::Http2, "HTTP/2.0"),
        (Protocol::Auto, "HTTP/2.0"),
    ] {
        let endpoints = Endpoints::new()
            .with_tls(tls.clone())
            .with_protocol(protocol);
        let endpoint = endpoint(&endpoints, address.clone());
        for _ in 0..3 {
            let body = get(&endpoint, "/hello").await.unwrap();
            assert_eq!(body, format!("a {version} /hello lane=-"), "{protocol}");
        }
    }
    // One connection per protocol: reused (HTTP/1.1) or shared (HTTP/2).
    assert_eq!(upstream.handshakes(), 3);

    // Without TLS settings, an `https://` instance is never spoken to in cleartext.
    let plain = endpoint(&Endpoints::new(), address);
    let error = get(&plain, "/").await.unwrap_err();
    assert!(error.to_string().contains("no TLS settings"), "{error}");
    assert_eq!(upstream.accepted(), 3, "no connection was even opened");
}

#[tokio::test]
async fn an_untrusted_expired_or_misnamed_certificate_fails_the_handshake_unsent() {
    let ca = Ca::new("test CA");
    let other = Ca::new("another CA");
    let cert = ca.issue(&Leaf::server(&["orders.internal"]));
    let upstream = Upstream::start("a", Some(server_config(&cert, None))).await;
    let address = format!("https://{}", upstream.addr());
    let (day, now) = (Duration::from_secs(86_400), SystemTime::now());
    let expired =
        ca.issue(&Leaf::server(&["orders.internal"]).with_validity(now - 30 * day, now - day));
    let stale = Upstream::start("a", Some(server_config(&expired, None))).await;
    let name = || -> ServerName<'static> { "orders.internal".try_into().unwrap() };

    let cases = [
        // Trusts another CA.
        (
            Tls::new(client_config(&other, None)).with_server_name(name()),
            &upstream,
            "UnknownIssuer",
        ),
        // Trusts the CA, checks a name the certificate is not for (the address's IP).
        (
            Tls::new(client_config(&ca, None)),
            &upstream,
            "NotValidForName",
        ),
        // Trusts the CA, the right name, a certificate past its end.
        (
            Tls::new(client_config(&ca, None)).with_server_name(name()),
            &stale,
            "Expired",
        ),
    ];
    for (tls, instance, reason) in cases {
        let endpoints = Endpoints::new().with_tls(tls);
        let address = format!("https://{}", instance.addr());
        let error = get(&endpoint(&endpoints, address.clone()), "/")
            .await
            .unwrap_err();
        let failed = request_error(&error);
        assert!(failed.is_tls() && failed.is_connect(), "{error}");
        let text = error.to_string();
        assert!(
            text.contains(&address) && text.contains("TLS handshake failed"),
            "{text}"
        );
        assert!(
            text.contains(reason) || format!("{error:?}").contains(reason),
            "{text}"
        );
        // Nothing was sent: a retrying balancer may send it elsewhere.
        let unsent = Unsent::find(&*error).expect("handed back");
        assert!(unsent.take::<Request<Empty<Bytes>>>().is_some());
    }
    assert_eq!(upstream.handshakes() + stale.handshakes(), 0);
    // With the right name, the same instance answers.
    let tls =
        Tls::new(client_config(&ca, None)).with_server_name("orders.internal".try_into().unwrap());
    let endpoints = Endpoints::new().with_tls(tls);
    assert_eq!(
        get(&endpoint(&endpoints, address), "/x").await.unwrap(),
        "a HTTP/1.1 /x lane=-"
    );
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let ca = Ca::new("test CA");
    let cert = ca.issue(&Leaf::server(&["127.0.0.1"]));
    let client = ca.issue(&Leaf::client("gateway"));
    let upstream = Upstream::start("a", Some(server_config(&cert, Some(&ca)))).await;
    let address = format!("https://{}", upstream.addr());

    let with = Endpoints::new().with_tls(Tls::new(client_config(&ca, Some(&client))));
    assert_eq!(
        get(&endpoint(&with, address.clone()), "/m").await.unwrap(),
        "a HTTP/1.1 /m lane=-"
    );

    // Without a certificate: TLS 1.3 reports the refusal after the client's handshake
    // ends, as the first read fails; either way the request fails and is not answered.
    let without = Endpoints::new().with_tls(Tls::new(client_config(&ca, None)));
    let error = get(&endpoint(&without, address), "/m").await.unwrap_err();
    let text = format!("{error} {error:?}");
    assert!(
        text.contains("CertificateRequired") || text.contains("certificate"),
        "{text}"
    );
    assert_eq!(
        upstream.handshakes(),
        1,
        "only the client with a certificate got through"
    );
}

#[tokio::test]
async fn every_instance_over_tls_whatever_its_address() {
    let ca = Ca::new("test CA");
    let cert = ca.issue(&Leaf::server(&["127.0.0.1"]));
    let upstream = Upstream::start("a", Some(server_config(&cert, None))).await;
    let tls = Tls::new(client_config(&ca, None)).with_every_instance(true);
    let endpoints = Endpoints::new().with_tls(tls).with_protocol(Protocol::Auto);
    let instance = endpoint(&endpoints, upstream.addr().to_string());
    assert_eq!(get(&instance, "/p").await.unwrap(), "a HTTP/2.0 /p lane=-");
}

#[tokio::test]
async fn h2c_shares_one_connection_among_a_thousand_concurrent_requests() {
    let upstream = Upstream::start("a", None).await;
    let endpoints = Endpoints::new().with_protocol(Protocol::Http2);
    let instance: Instance = support::instance("a", upstream.addr(), &[]);
    let endpoint = endpoints.endpoint(instance);
    let answers = join_all((0..1_000).map(|i| {
        let endpoint = endpoint.clone();
        async move { get(&endpoint, &format!("/{i}")).await }
    }))
    .await;
    for (i, answer) in answers.into_iter().enumerate() {
        assert_eq!(answer.unwrap(), format!("a HTTP/2.0 /{i} lane=-"));
    }
    assert_eq!(upstream.accepted(), 1, "one connection, multiplexed");

    // Cleartext `auto` is HTTP/1.1: there is no ALPN to ask.
    let auto = Endpoints::new().with_protocol(Protocol::Auto);
    let endpoint = auto.endpoint(support::instance("a", upstream.addr(), &[]));
    assert_eq!(get(&endpoint, "/").await.unwrap(), "a HTTP/1.1 / lane=-");
}
