//! End to end: real HTTP instances on loopback, fed to the balancer by gray-discovery's
//! static source and HTTP endpoints, with one gray instance that refuses connections.

use std::{convert::Infallible, net::SocketAddr, time::Duration};

use bytes::Bytes;
use gray_balance::{
    BalanceLayer,
    error::Unroutable,
    health::{Ejection, Failure, classify},
};
use gray_core::{Labels, Lane, Stain, backoff::Backoff};
use gray_discovery::{Instance, StaticDiscover, http::HttpEndpoints};
use gray_policy::Policy;
use gray_test_support::{WAIT, net::closed_port};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tower::{BoxError, Layer, Service, ServiceExt};

/// An HTTP server on a loopback port that answers every request with `name`.
async fn serve(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| async move {
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                        name.as_bytes(),
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

fn instance(id: &str, addr: SocketAddr, labels: &[(&str, &str)]) -> Instance {
    Instance::new(
        id.parse().unwrap(),
        addr.to_string().parse().unwrap(),
        Labels::from_iter(labels.iter().copied()),
    )
}

fn request(stain: Option<Stain>) -> http::Request<Full<Bytes>> {
    let mut req = http::Request::get("/hello")
        .body(Full::new(Bytes::new()))
        .unwrap();
    if let Some(stain) = stain {
        req.extensions_mut().insert(stain);
    }
    req
}

async fn send<S>(svc: &mut S, stain: Option<Stain>) -> Result<String, BoxError>
where
    S: Service<
            http::Request<Full<Bytes>>,
            Response = http::Response<gray_discovery::http::ResponseBody>,
            Error = BoxError,
        >,
{
    let response = svc.ready().await?.call(request(stain)).await?;
    let body = response.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn routes_real_http_by_lane_and_ejects_a_dead_gray_instance() {
    let base1 = serve("base-1").await;
    let base2 = serve("base-2").await;
    let gray1 = serve("gray-1").await;
    let dead = closed_port();

    let instances = StaticDiscover::new([
        instance("base-1", base1, &[]),
        instance("base-2", base2, &[("gray", "false")]),
        instance("gray-1", gray1, &[("gray", "true")]),
        instance("gray-dead", dead.addr(), &[("gray", "TRUE")]),
    ]);
    let endpoints = HttpEndpoints::<_, Full<Bytes>>::new().discover(instances);
    let backoff = Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
    let ejection = Ejection::new().with_consecutive(2).with_backoff(backoff);
    // Peak-EWMA (the default): sequential requests reach every instance, because each new
    // one is probed before p2c compares costs.
    let mut balance = BalanceLayer::new("svc-b", Policy::seed_000())
        .with_ejection(ejection)
        .layer(endpoints);
    let gray = Stain::in_lane(Lane::new("gray").unwrap());

    // Baseline traffic reaches both baseline instances and never a gray one.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        seen.insert(send(&mut balance, Some(Stain::baseline())).await.unwrap());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["base-1", "base-2"]);

    // Gray traffic reaches the gray instances; the dead one refuses its first request,
    // and a refusal takes it out at once (two errors in a row are needed for others).
    let mut errors = 0;
    for _ in 0..200 {
        match send(&mut balance, Some(gray.clone())).await {
            Ok(name) => assert_eq!(name, "gray-1"),
            Err(e) => {
                assert_eq!(classify(&*e), Failure::Refused, "{e}");
                errors += 1;
            }
        }
    }
    assert_eq!(errors, 1, "the dead instance was picked once, and refused");
    // The background task ejects it.
    let deadline = tokio::time::Instant::now() + WAIT;
    while balance.ready_len() != 3 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(balance.ready_len(), 3);
    for _ in 0..20 {
        assert_eq!(
            send(&mut balance, Some(gray.clone())).await.unwrap(),
            "gray-1"
        );
    }
    // Explanations show it ejected.
    let decision = balance.explain(Some(&gray));
    let dead_step = decision.steps.first().unwrap();
    assert_eq!(
        dead_step.present, 1,
        "the ejected instance counts as absent"
    );
    assert_eq!(decision.candidates().unwrap().len(), 1);

    // No stain at all and no own lane: baseline.
    let name = send(&mut balance, None).await.unwrap();
    assert!(name.starts_with("base-"), "{name}");
}

#[tokio::test]
async fn unroutable_names_service_lane_and_policy() {
    let base1 = serve("base-1").await;
    let instances = StaticDiscover::new([instance("base-1", base1, &[])]);
    let endpoints = HttpEndpoints::<_, Full<Bytes>>::new().discover(instances);
    let mut balance =
        BalanceLayer::new("svc-b", Policy::new().with_name("strict")).layer(endpoints);
    let canary = Stain::in_lane(Lane::new("canary").unwrap());
    let err = send(&mut balance, Some(canary)).await.unwrap_err();
    let err = err.downcast::<Unroutable>().unwrap();
    assert_eq!(
        err.to_string(),
        "no instance of `svc-b` fits lane `canary` (policy `strict`, fallback `none`)"
    );
    assert_eq!(send(&mut balance, None).await.unwrap(), "base-1");
}
