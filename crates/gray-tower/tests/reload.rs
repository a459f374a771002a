//! The rules change 100 times while 10,000 requests flow through the edge on a
//! multi-thread runtime: every request is decided by exactly one snapshot, and none fails.

use std::{
    collections::BTreeSet,
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use gray_core::Stain;
use gray_rules::Format;
use gray_tower::{
    edge::{EdgeDecision, EdgeLayer, LiveRules, PeerAddr, Revision},
    task,
};
use http::{Request, Response};
use tower::{Layer, ServiceExt, service_fn};

const VERSIONS: u64 = 100;
const REQUESTS: usize = 10_000;
const WORKERS: usize = 8;

/// Version `n` of the rules: every request goes to lane `gen-n`, pinned to version `v<n>`,
/// by a rule named `rule-n`.
fn rules_text(n: u64) -> String {
    format!(r#"{{"rules":[{{"name":"rule-{n}","lane":"gen-{n}","version":"v{n}"}}]}}"#)
}

/// The version number a request saw, checking that all its views agree on it.
fn version_seen(req: &Request<()>) -> Result<u64, String> {
    let lane = req
        .headers()
        .get("x-gray-lane")
        .ok_or("no lane header")?
        .to_str()
        .map_err(|e| e.to_string())?;
    let n: u64 = lane
        .strip_prefix("gen-")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("bad lane {lane}"))?;
    let info = req.headers().get("x-gray-info").ok_or("no route header")?;
    if info != format!(r#"{{"all":"v{n}"}}"#).as_str() {
        return Err(format!("lane gen-{n} with route header {info:?}"));
    }
    let stain = req.extensions().get::<Stain>().ok_or("no context")?;
    if stain.lane().map(|l| l.as_str()) != Some(lane) {
        return Err(format!("extension lane {stain:?} vs header {lane}"));
    }
    if stain.version_for("any").map(|v| v.as_str()) != Some(&format!("v{n}")) {
        return Err(format!("extension pins {stain:?} vs lane {lane}"));
    }
    if task::current().as_ref() != Some(stain) {
        return Err("task-local differs from the extension".into());
    }
    let d = req
        .extensions()
        .get::<EdgeDecision>()
        .ok_or("no decision")?;
    if d.rule_name.as_deref() != Some(format!("rule-{n}").as_str()) {
        return Err(format!("rule {:?} vs lane {lane}", d.rule_name));
    }
    // Version 0 is generation 1, and each accepted version adds one.
    if d.generation != n + 1 {
        return Err(format!("generation {} vs lane {lane}", d.generation));
    }
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_decided_by_exactly_one_snapshot() {
    let live = LiveRules::new(
        gray_rules::RuleSet::parse(&rules_text(0), Format::Json, "v0").expect("rules v0"),
    );
    let layer = EdgeLayer::new(live.clone());
    let done = Arc::new(AtomicUsize::new(0));

    let backend = service_fn(|req: Request<()>| async move {
        let before = version_seen(&req);
        // Cross an await point (and so, possibly, a reload) before checking again.
        tokio::task::yield_now().await;
        let after = version_seen(&req);
        Ok::<_, Infallible>(Response::new(match (before, after) {
            (Ok(a), Ok(b)) if a == b => Ok(a),
            (a, b) => Err(format!("inconsistent request: {a:?} then {b:?}")),
        }))
    });

    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let svc = layer.layer(backend);
        let done = done.clone();
        workers.push(tokio::spawn(async move {
            let mut seen = BTreeSet::new();
            for i in 0..REQUESTS / WORKERS {
                let req = Request::builder()
                    .uri(format!("/w{w}/r{i}"))
                    .header("x-gray-lane", "forged")
                    .extension(PeerAddr(([203, 0, 113, 1], 4000).into()))
                    .body(())
                    .expect("request");
                let res = svc.clone().oneshot(req).await.expect("infallible");
                seen.insert(res.into_body().into_inner().expect("passed")?);
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, String>(seen)
        }));
    }

    // Reload while the requests flow: version n once n × 95 requests are done.
    let writer = {
        let live = live.clone();
        let done = done.clone();
        tokio::spawn(async move {
            for n in 1..=VERSIONS {
                let mut spins = 0u64;
                while done.load(Ordering::Relaxed) < n as usize * 95 {
                    spins += 1;
                    assert!(spins < 50_000_000, "requests stalled at version {n}");
                    tokio::task::yield_now().await;
                }
                let generation = live
                    .apply(&rules_text(n), Format::Json, "reload", Revision::Manual(n))
                    .expect("valid version");
                assert_eq!(generation, n + 1);
            }
        })
    };

    let mut versions = BTreeSet::new();
    for w in workers {
        let seen = w.await.expect("worker").unwrap_or_else(|e| panic!("{e}"));
        versions.extend(seen);
    }
    writer.await.expect("writer");
    assert_eq!(done.load(Ordering::Relaxed), REQUESTS);
    let status = live.status();
    assert_eq!(status.generation, VERSIONS + 1);
    assert_eq!(status.revision, Revision::Manual(VERSIONS));
    assert_eq!(status.rejected, 0);
    // The requests were spread over the reloads, not all before or after them.
    assert!(
        versions.len() > (VERSIONS / 2) as usize,
        "requests saw only {} versions",
        versions.len()
    );
}
