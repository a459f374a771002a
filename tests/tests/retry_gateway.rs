//! Killed instances behind the real gateway, with real instances as child processes: at
//! 200 requests per second, stained and unstained, the gray instance is SIGKILLed, then one
//! of the two baseline instances, then both are started again on the same addresses.
//!
//! With `GET`s, no client sees an error: a refused connection goes to another instance
//! that fits the stain (gray falls back to baseline), a connection that broke under an
//! idempotent request is retried once, the refused instance is out of the picks at once,
//! and the restarted ones come back through a connect probe, not through a user's request.
//! `/metrics` shows the retries.
//!
//! With `POST`s, only requests already sent to the killed instance may fail: each id is
//! processed at most once, and every failure names the killed instance and was processed
//! by no other one. The test counts them.

use std::{collections::HashMap, net::SocketAddr, path::Path, time::Duration};

use gray_gateway::Gateway;
use gray_test_support::TempDir;
use gray_tests::{
    load::{Load, kill_and_restart},
    process::{Instance, Protocol},
    reqwest_builder,
};

const BIN: &str = env!("CARGO_BIN_EXE_gray-test-upstream");

/// What a client got: the status, the instance that answered (`x-gray-instance`) and the
/// body; or the transport error.
type Outcome = Result<(u16, String, String), String>;

/// The three instances of `svc` and the gateway in front of them.
struct Setup {
    gray: Instance,
    base1: Instance,
    base2: Instance,
    gateway: Gateway,
    dir: TempDir,
}

async fn setup(tag: &str, log: bool) -> Setup {
    let dir = TempDir::new(tag);
    let start = |name: &'static str| {
        let path = dir.path().join(format!("{name}.log"));
        async move {
            let log = log.then_some(path.as_path());
            Instance::start(BIN, name, Protocol::Http, log).await
        }
    };
    let gray = start("gray-1").await;
    let base1 = start("base-1").await;
    let base2 = start("base-2").await;
    std::fs::write(
        dir.path().join("instances.toml"),
        format!(
            "[[services.svc]]\nid = \"gray-1\"\naddress = \"{}\"\nlabels = {{ gray = true }}\n\n\
             [[services.svc]]\nid = \"base-1\"\naddress = \"{}\"\n\n\
             [[services.svc]]\nid = \"base-2\"\naddress = \"{}\"\n",
            gray.addr(),
            base1.addr(),
            base2.addr()
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("rules.toml"), gray_tests::TESTERS_RULES).unwrap();
    // Seed 000: gray requests go to gray, else fall back to baseline; baseline never goes
    // to gray. The probe's first delay is short, so that the run stays short.
    std::fs::write(
        dir.path().join("gateway.toml"),
        "listen = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nrules = \"rules.toml\"\n\
         instances = \"instances.toml\"\nupstream_timeout_ms = 5000\n\n\
         [services.svc]\npreset = \"seed-000\"\n\
         retry = { budget_percent = 20, idempotent = true }\n\
         health_check = { interval_ms = 250, max_interval_ms = 2000 }\n",
    )
    .unwrap();
    let gateway = gray_tests::start_gateway(dir.path()).await;
    Setup {
        gray,
        base1,
        base2,
        gateway,
        dir,
    }
}

/// One request of the load: every other one stained gray.
async fn send(client: reqwest::Client, gw: SocketAddr, i: usize, post: bool) -> Outcome {
    let url = format!("http://{gw}/svc/item/{i}");
    let mut request = match post {
        true => client.post(url).body(format!("post-{i}")),
        false => client.get(url),
    };
    if i.is_multiple_of(2) {
        request = request.header("x-tester", "1");
    }
    let response = request.send().await.map_err(|e| format!("{e:?}"))?;
    let status = response.status().as_u16();
    let instance = response
        .headers()
        .get("x-gray-instance")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let body = response.text().await.map_err(|e| format!("{e:?}"))?;
    Ok((status, instance, body))
}

/// The scenario, at 200 requests per second: kill gray, kill base-1, start both again;
/// returns every outcome once both serve again and 2,000 requests were answered.
async fn scenario(s: &mut Setup, post: bool) -> Vec<Outcome> {
    let client = reqwest_builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let gw = s.gateway.addr();
    let load = Load::start(200, move |i| send(client.clone(), gw, i, post));
    fn served_by(o: &Outcome) -> Option<&str> {
        match o {
            Ok((200, instance, _)) => Some(instance.as_str()),
            _ => None,
        }
    }
    kill_and_restart(load, &mut s.gray, &mut s.base1, served_by).await
}

/// `gray_gateway_retries_total` of `svc` for `reason`.
async fn retries(admin: SocketAddr, reason: &str) -> u64 {
    let text = reqwest_builder()
        .build()
        .unwrap()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = format!("gray_gateway_retries_total{{service=\"svc\",reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no {series} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_instances_cost_no_client_an_error() {
    let mut s = setup("retry-gateway-get", false).await;
    let outcomes = scenario(&mut s, false).await;
    let failed: Vec<_> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| !matches!(o, Ok((200, ..))))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        outcomes.len()
    );
    // Gray requests went to gray while it lived, never baseline ones.
    for (i, outcome) in outcomes.iter().enumerate() {
        let Ok((_, instance, body)) = outcome else {
            unreachable!()
        };
        assert_eq!(instance, body, "request {i}");
        if i % 2 == 1 {
            assert_ne!(instance, "gray-1", "baseline request {i} went to gray");
        }
    }
    let admin = s.gateway.admin_addr().unwrap();
    assert!(
        retries(admin, "refused").await >= 1,
        "the refusals were retried"
    );
    s.gateway.shutdown().await;
    drop(s.base2);
}

/// The ids each instance processed, from its log.
fn processed(dir: &Path, names: &[&str]) -> HashMap<String, Vec<String>> {
    let mut by_id: HashMap<String, Vec<String>> = HashMap::new();
    for name in names {
        let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        for id in log.lines() {
            by_id
                .entry(id.to_owned())
                .or_default()
                .push((*name).to_owned());
        }
    }
    by_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_instances_fail_only_the_posts_they_had() {
    let mut s = setup("retry-gateway-post", true).await;
    let outcomes = scenario(&mut s, true).await;
    let by_id = processed(s.dir.path(), &["gray-1", "base-1", "base-2"]);
    let killed = [
        ("gray-1", s.gray.addr().to_string()),
        ("base-1", s.base1.addr().to_string()),
    ];
    let mut failures = Vec::new();
    for (i, outcome) in outcomes.iter().enumerate() {
        let id = format!("post-{i}");
        let seen = by_id.get(&id).map_or(&[][..], Vec::as_slice);
        // Never processed twice: a POST is not sent again once sent.
        assert!(seen.len() <= 1, "{id} processed by {seen:?}");
        match outcome {
            Ok((200, instance, _)) => assert_eq!(seen, std::slice::from_ref(instance), "{id}"),
            other => {
                // The gateway's 502 names the instance the request was sent to: a killed
                // one, and only it may have processed it.
                let detail = format!("{other:?}");
                let culprit = killed.iter().find(|(_, addr)| {
                    detail.contains(&format!("request failed at http://{addr}/"))
                });
                let Some((name, _)) = culprit else {
                    panic!("{id} failed, and not after it was sent to a killed instance: {detail}");
                };
                assert!(
                    seen.is_empty() || seen == [name.to_string()],
                    "{id} failed at {name} but was processed by {seen:?}"
                );
                failures.push(id);
            }
        }
    }
    // The requests in flight to an instance when it died, at most: a handful.
    assert!(
        failures.len() <= 10,
        "{} of {} POSTs failed: {failures:?}",
        failures.len(),
        outcomes.len()
    );
    let admin = s.gateway.admin_addr().unwrap();
    assert!(
        retries(admin, "refused").await >= 1,
        "refused POSTs were retried"
    );
    s.gateway.shutdown().await;
    drop(s.base2);
}
