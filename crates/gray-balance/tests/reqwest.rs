//! reqwest routing end to end: real axum servers on loopback, a real reqwest client with
//! `RouteMiddleware`; `http://stock/…` goes to an instance picked by the stain.

use std::{collections::BTreeSet, convert::Infallible, net::SocketAddr, time::Duration};

use axum::{Router, extract::State, http::Uri, routing::any};
use gray_balance::{
    Balance, BalanceLayer,
    error::Unroutable,
    health::Ejection,
    reqwest::{RouteError, RouteMiddleware, UnknownHosts},
    retry::RetryPolicy,
};
use gray_core::{Labelled, Labels, Lane, Origin, Stain};
use gray_policy::Policy;
use gray_test_support::{WAIT, net::closed_port};
use http::uri::{Authority, Scheme};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tokio::net::TcpListener;
use tower::discover::Change;

/// An instance of ours: where it listens and its labels.
#[derive(Debug, Clone)]
struct Instance {
    authority: Authority,
    labels: Labels,
}

impl Labelled for Instance {
    fn labels(&self) -> &Labels {
        &self.labels
    }
}

impl Origin for Instance {
    fn scheme(&self) -> &Scheme {
        &Scheme::HTTP
    }

    fn authority(&self) -> &Authority {
        &self.authority
    }
}

/// A server answering `name path?query` on a loopback port.
async fn serve(name: &'static str) -> SocketAddr {
    async fn answer(State(name): State<&'static str>, uri: Uri) -> String {
        format!("{name} {uri}")
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().fallback(any(answer)).with_state(name);
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn instance(addr: SocketAddr, gray: bool) -> Instance {
    let labels = if gray {
        Labels::from_iter([("gray", "true")])
    } else {
        Labels::new()
    };
    Instance {
        authority: addr.to_string().parse().unwrap(),
        labels,
    }
}

fn balancer(
    policy: Policy,
    ejection: Ejection,
    instances: Vec<(&'static str, Instance)>,
) -> Balance<&'static str, Instance> {
    let changes = instances
        .into_iter()
        .map(|(id, i)| Ok::<_, Infallible>(Change::Insert(id, i)));
    BalanceLayer::new("stock", policy)
        .with_ejection(ejection)
        .build(futures_util::stream::iter(changes))
}

fn client(route: RouteMiddleware<&'static str, Instance>) -> ClientWithMiddleware {
    ClientBuilder::new(
        // Loopback only: a proxy variable in the environment must not take the requests.
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("a client"),
    )
    .with(route)
    .build()
}

async fn get(
    client: &ClientWithMiddleware,
    url: &str,
    stain: Option<Stain>,
) -> Result<String, reqwest_middleware::Error> {
    let mut req = client.get(url);
    if let Some(stain) = stain {
        req = req.with_extension(stain);
    }
    Ok(req.send().await?.text().await?)
}

fn gray() -> Stain {
    Stain::in_lane(Lane::new("gray").unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stained_requests_reach_gray_instances_only_and_unstained_baseline_only() {
    let instances = vec![
        ("base-1", instance(serve("base-1").await, false)),
        ("base-2", instance(serve("base-2").await, false)),
        ("gray-1", instance(serve("gray-1").await, true)),
    ];
    let stock = balancer(Policy::seed_000(), Ejection::default(), instances);
    let client = client(RouteMiddleware::new().route("stock", stock));

    // Path and query survive the rewrite.
    let body = get(&client, "http://stock/items/7?full=1", Some(gray()))
        .await
        .unwrap();
    assert_eq!(body, "gray-1 /items/7?full=1");

    // 400 mixed concurrent requests: zero misroutes, and both baseline instances serve.
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let stain = (i % 2 == 0).then(gray);
                let body = get(&client, &format!("http://stock/{i}"), stain)
                    .await
                    .unwrap();
                (i, body)
            })
        })
        .collect();
    let mut baseline = BTreeSet::new();
    for task in tasks {
        let (i, body) = task.await.unwrap();
        let (name, path) = body.split_once(' ').unwrap();
        assert_eq!(path, format!("/{i}"));
        if i % 2 == 0 {
            assert_eq!(name, "gray-1", "request {i}");
        } else {
            assert!(name.starts_with("base-"), "request {i} went to {name}");
            baseline.insert(name.to_owned());
        }
    }
    assert_eq!(baseline.len(), 2, "{baseline:?}");

    // No extension: the task-local stain.
    let body = gray_core::task::scope(gray(), get(&client, "http://STOCK/x", None))
        .await
        .unwrap();
    assert_eq!(body, "gray-1 /x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_hosts_pass_or_fail_as_configured() {
    let stock = balancer(
        Policy::seed_000(),
        Ejection::default(),
        vec![("base-1", instance(serve("base-1").await, false))],
    );
    let other = serve("other").await;
    let url = format!("http://{other}/direct");

    let passing = client(RouteMiddleware::new().route("stock", stock.clone()));
    assert_eq!(
        get(&passing, &url, Some(gray())).await.unwrap(),
        "other /direct"
    );

    let failing = client(
        RouteMiddleware::new()
            .route("stock", stock)
            .with_unknown_hosts(UnknownHosts::Fail),
    );
    let err = get(&failing, &url, None).await.unwrap_err();
    let reqwest_middleware::Error::Middleware(err) = err else {
        panic!("{err}");
    };
    assert_eq!(
        err.downcast_ref::<RouteError>(),
        Some(&RouteError::UnknownHost {
            host: "127.0.0.1".into()
        })
    );
    assert_eq!(
        get(&failing, "http://stock/routed", None).await.unwrap(),
        "base-1 /routed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_fits_names_service_lane_and_policy() {
    let stock = balancer(
        Policy::new().with_name("strict"),
        Ejection::default(),
        vec![("base-1", instance(serve("base-1").await, false))],
    );
    let client = client(RouteMiddleware::new().route("stock", stock));
    let err = get(&client, "http://stock/x", Some(gray()))
        .await
        .unwrap_err();
    assert!(err.is_middleware());
    assert_eq!(
        err.to_string(),
        "no instance of `stock` fits lane `gray` (policy `strict`, fallback `none`)"
    );
    let reqwest_middleware::Error::Middleware(err) = err else {
        unreachable!()
    };
    let unroutable = err.downcast_ref::<Unroutable>().unwrap();
    assert_eq!(
        (
            unroutable.service(),
            unroutable.policy(),
            unroutable.lane().map(Lane::as_str)
        ),
        ("stock", "strict", Some("gray"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_retried_and_ejects_the_instance_at_once() {
    let dead = closed_port();
    // The default ejection needs 5 connection errors in a row; a refusal needs one.
    let stock = balancer(
        Policy::seed_000(),
        Ejection::default(),
        vec![
            ("gray-1", instance(serve("gray-1").await, true)),
            ("gray-dead", instance(dead.addr(), true)),
        ],
    );
    let client = client(RouteMiddleware::new().route("stock", stock.clone()));
    // Both are probed: the dead one refuses, the request goes to the other, and the dead
    // one is out.
    for _ in 0..10 {
        let body = get(&client, "http://stock/x", Some(gray())).await.unwrap();
        assert_eq!(body, "gray-1 /x");
    }
    let retries = stock.retries();
    assert_eq!(retries.refused, 1, "{retries:?}");
    assert_eq!(retries.total(), 1, "{retries:?}");
    let deadline = tokio::time::Instant::now() + WAIT;
    while stock.ready_len() != 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!((stock.len(), stock.ready_len()), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_retries_a_refusal_reaches_the_caller_once() {
    let dead = closed_port();
    let changes = [
        ("gray-1", instance(serve("gray-1").await, true)),
        ("gray-dead", instance(dead.addr(), true)),
    ]
    .map(|(id, i)| Ok::<_, Infallible>(Change::Insert(id, i)));
    let stock = BalanceLayer::new("stock", Policy::seed_000())
        .with_retry(RetryPolicy::disabled())
        .build(futures_util::stream::iter(changes));
    let client = client(RouteMiddleware::new().route("stock", stock.clone()));
    let mut refused = 0;
    for _ in 0..10 {
        match get(&client, "http://stock/x", Some(gray())).await {
            Ok(body) => assert_eq!(body, "gray-1 /x"),
            Err(e) => {
                assert!(e.is_connect(), "{e}");
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 1, "out after its first refusal");
    assert_eq!(stock.retries().total(), 0);
}
