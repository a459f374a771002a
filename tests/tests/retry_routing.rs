//! Killed instances under reqwest routing (`RouteMiddleware`) and tonic routing
//! (`GrpcChannels` + a balancer), with real instances as child processes: at 200 requests
//! (unary calls) per second, stained and unstained, the gray instance is SIGKILLed, then
//! one of the two baseline instances, then both are started again on the same addresses.
//! No call fails: refused connections and broken idempotent ones go to another instance
//! that fits the stain, and the restarted instances come back through a probe (a connect
//! for reqwest, gRPC's health check for tonic), not through a user's call.

use std::{net::SocketAddr, time::Duration};

use gray_balance::{
    Balance, BalanceLayer,
    health::{Ejection, Probe},
    reqwest::RouteMiddleware,
    retry::{Copies, Retry, RetryPolicy},
};
use gray_core::{Labels, Lane, Stain, backoff::Backoff};
use gray_discovery::{
    Endpoint, Instance as Registered, InstanceId, Registry,
    grpc::{AnyBody, GrpcChannels},
};
use gray_policy::Policy;
use gray_tests::{
    load::{Load, kill_and_restart},
    process::{Instance, Protocol},
    proto::{HopRequest, hop_client::HopClient},
    reqwest_builder,
};
use gray_tower::{PropagateStain, PropagateStainLayer};
use tonic::transport::Channel;
use tower::ServiceBuilder;

const BIN: &str = env!("CARGO_BIN_EXE_gray-test-upstream");

/// Which instance answered, or the error.
type Outcome = Result<String, String>;

struct Instances {
    gray: Instance,
    base1: Instance,
    base2: Instance,
}

async fn instances(protocol: Protocol) -> Instances {
    Instances {
        gray: Instance::start(BIN, "gray-1", protocol, None).await,
        base1: Instance::start(BIN, "base-1", protocol, None).await,
        base2: Instance::start(BIN, "base-2", protocol, None).await,
    }
}

/// The registry of `svc`: gray-1 labelled `gray=true`.
fn registry(i: &Instances) -> Registry {
    let instance = |id: &str, addr: SocketAddr, gray: bool| {
        let labels = match gray {
            true => Labels::from_iter([("gray", "true")]),
            false => Labels::new(),
        };
        Registered::new(
            id.parse().unwrap(),
            addr.to_string().parse().unwrap(),
            labels,
        )
    };
    Registry::from_static([(
        "svc",
        [
            instance("gray-1", i.gray.addr(), true),
            instance("base-1", i.base1.addr(), false),
            instance("base-2", i.base2.addr(), false),
        ],
    )])
    .unwrap()
}

/// Seed 000 (gray falls back to baseline), ejected instances probed after 250 ms at
/// first.
fn layer(probe: Probe, retry: RetryPolicy) -> BalanceLayer {
    let backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(2));
    BalanceLayer::new("svc", Policy::seed_000())
        .with_ejection(Ejection::new().with_backoff(backoff))
        .with_probe(probe)
        .with_retry(retry)
}

fn stain(i: usize) -> Stain {
    match i % 2 {
        0 => Stain::in_lane(Lane::new("gray").unwrap()),
        _ => Stain::baseline(),
    }
}

/// The scenario, at 200 calls per second; returns every outcome once both killed
/// instances serve again and 2,000 calls were answered.
async fn scenario<F, Fut>(i: &mut Instances, call: F) -> Vec<Outcome>
where
    F: Fn(usize) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Outcome> + Send + 'static,
{
    let load = Load::start(200, call);
    fn served_by(o: &Outcome) -> Option<&str> {
        o.as_deref().ok()
    }
    kill_and_restart(load, &mut i.gray, &mut i.base1, served_by).await
}

/// No call failed, and none of baseline went to gray.
fn assert_all_served(outcomes: &[Outcome]) {
    let failed: Vec<_> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_err())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} calls failed: {failed:?}",
        failed.len(),
        outcomes.len()
    );
    for (n, outcome) in outcomes.iter().enumerate().skip(1).step_by(2) {
        assert_ne!(
            outcome.as_deref(),
            Ok("gray-1"),
            "baseline call {n} went to gray"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_routing_loses_no_request_to_killed_instances() {
    let mut i = instances(Protocol::Http).await;
    let registry = registry(&i);
    let balance: Balance<InstanceId, Registered> = layer(Probe::connect(), RetryPolicy::new())
        .build(registry.service("svc").unwrap().discover());
    let client = reqwest_middleware::ClientBuilder::new(
        reqwest_builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
    )
    .with(RouteMiddleware::new().route("svc", balance.clone()))
    .build();
    let outcomes = scenario(&mut i, move |n| {
        let client = client.clone();
        async move {
            let response = client
                .get(format!("http://svc/item/{n}"))
                .with_extension(stain(n))
                .send()
                .await
                .map_err(|e| format!("{e:?}"))?;
            let status = response.status();
            let body = response.text().await.map_err(|e| format!("{e:?}"))?;
            match status.is_success() {
                true => Ok(body),
                false => Err(format!("{status}: {body}")),
            }
        }
    })
    .await;
    assert_all_served(&outcomes);
    let retries = balance.retries();
    assert!(retries.refused >= 1, "{retries:?}");
    drop(i.base2);
}

/// Channels to `svc`'s instances, taking the replayable bodies of the retries.
type Channels = Retry<InstanceId, Endpoint<AnyBody<Channel>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_routing_loses_no_unary_call_to_killed_instances() {
    let mut i = instances(Protocol::Grpc).await;
    let registry = registry(&i);
    let channels = GrpcChannels::new()
        .with_endpoint(|e| e.timeout(Duration::from_secs(10)))
        .any_body();
    // A channel drops a call it could not send: every call is copied. The calls of this
    // service are reads, safe to repeat: idempotent, so a call whose connection broke
    // under it is sent again too.
    let retry = RetryPolicy::new()
        .with_copies(Copies::All)
        .with_idempotent([http::Method::POST]);
    let balance =
        layer(Probe::grpc(""), retry).build(registry.service("svc").unwrap().endpoints(channels));
    let routed: Channels = Retry::new(balance.clone());
    let client: HopClient<PropagateStain<Channels>> = HopClient::new(
        ServiceBuilder::new()
            .layer(PropagateStainLayer::new())
            .service(routed),
    );
    let outcomes = scenario(&mut i, move |n| {
        let mut client = client.clone();
        gray_core::task::scope(stain(n), async move {
            let reply = client
                .call(HopRequest {
                    path: format!("/item/{n}"),
                })
                .await
                .map_err(|status| format!("{status:?}"))?;
            Ok(reply.into_inner().trail.join(","))
        })
    })
    .await;
    assert_all_served(&outcomes);
    let retries = balance.retries();
    assert!(retries.refused + retries.unsent >= 1, "{retries:?}");
    drop(i.base2);
}
