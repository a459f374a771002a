//! Evaluating rules per request: `cargo bench -p gray-rules --bench rules`.
//!
//! `rules_20`: a set that mixes every condition kind; the requests hit the last rule, the
//! middle, and no rule at all (every rule checked), which is the worst case. `split`: one
//! rule that splits between 3 arms, sticky by a user header or random, against a sticky
//! percentage.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gray_rules::{Format, RequestView, RuleSet};
use http::{HeaderMap, HeaderValue, Uri};

fn rule_set() -> RuleSet {
    let mut rules = Vec::new();
    for i in 0..4 {
        rules.push(format!(
            r#"{{"name":"header {i}","when":{{"header":{{"name":"x-tenant","exact":"tenant-{i}"}}}},"lane":"h{i}"}}"#
        ));
        rules.push(format!(
            r#"{{"name":"cookie {i}","when":{{"cookie":{{"name":"beta","one_of":["b{i}","c{i}"]}}}},"lane":"c{i}"}}"#
        ));
        rules.push(format!(
            r#"{{"name":"ip {i}","when":{{"ip":["10.{i}.0.0/16","192.168.{i}.0/24","2001:db8:{i}::/48"]}},"lane":"ip{i}"}}"#
        ));
        rules.push(format!(
            r#"{{"name":"query {i}","when":{{"all":[{{"path":{{"prefix":"/api/{i}/"}}}},{{"query":{{"name":"canary","exact":"{i}"}}}}]}},"version":"v{i}","services":{{"svc-b":"v{i}.1"}}}}"#
        ));
        rules.push(format!(
            r#"{{"name":"sticky {i}","when":{{"all":[{{"header":{{"name":"x-region","exact":"r{i}"}}}},{{"sticky":{{"by":{{"header":"x-user-id"}},"percent":10,"salt":"s{i}"}}}}]}},"lane":"s{i}"}}"#
        ));
    }
    let text = format!(r#"{{"rules":[{}]}}"#, rules.join(","));
    let set = RuleSet::parse(&text, Format::Json, "bench").expect("valid bench rules");
    assert_eq!(set.rules().len(), 20);
    set
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, HeaderValue::from_static(v));
    }
    h
}

fn bench(c: &mut Criterion) {
    let set = rule_set();
    let common = headers(&[
        ("x-user-id", "user-12345"),
        ("cookie", "session=abc; theme=dark; beta=zz"),
        ("user-agent", "bench/1.0"),
        ("accept", "*/*"),
    ]);
    let uri: Uri = "/api/9/orders?page=2&canary=7".parse().expect("uri");
    let ip = Some([203, 0, 113, 7].into());

    let mut g = c.benchmark_group("rules_20");
    g.bench_function("no_match_all_checked", |b| {
        b.iter(|| {
            let view = RequestView::new(black_box(&uri), black_box(&common)).with_client_ip(ip);
            black_box(set.evaluate(&view).map(|d| d.rule().index()))
        })
    });

    let mut last = common.clone();
    last.insert("x-region", HeaderValue::from_static("r3"));
    let last_uri: Uri = "/api/3/orders?canary=3".parse().expect("uri");
    g.bench_function("match_query_rule_18", |b| {
        b.iter(|| {
            let view = RequestView::new(black_box(&last_uri), black_box(&last)).with_client_ip(ip);
            black_box(set.evaluate(&view).map(|d| d.into_stain()))
        })
    });

    let ip_mid = Some([10, 2, 3, 4].into());
    g.bench_function("match_ip_rule_12", |b| {
        b.iter(|| {
            let view = RequestView::new(black_box(&uri), black_box(&common)).with_client_ip(ip_mid);
            black_box(set.evaluate(&view).map(|d| d.into_stain()))
        })
    });
    g.finish();
}

fn one_rule(json: &str) -> RuleSet {
    RuleSet::parse(&format!(r#"{{"rules":[{json}]}}"#), Format::Json, "bench")
        .expect("a valid rule")
}

fn bench_split(c: &mut Criterion) {
    let arms = r#"[{"weight":80},{"weight":15,"lane":"canary-1"},{"weight":5,"lane":"canary-2"}]"#;
    let sticky = one_rule(&format!(
        r#"{{"split":{{"by":{{"header":"x-user-id"}},"salt":"checkout","arms":{arms}}}}}"#
    ));
    let random = one_rule(&format!(r#"{{"split":{arms}}}"#));
    let percent = one_rule(
        r#"{"when":{"sticky":{"by":{"header":"x-user-id"},"percent":20,"salt":"checkout"}},"lane":"canary-1"}"#,
    );
    let headers = headers(&[
        ("x-user-id", "user-12345"),
        ("user-agent", "bench/1.0"),
        ("accept", "*/*"),
    ]);
    let uri: Uri = "/checkout".parse().expect("uri");

    let mut g = c.benchmark_group("split");
    for (name, set) in [
        ("sticky_3_arms", &sticky),
        ("random_3_arms", &random),
        ("sticky_percent", &percent),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let view = RequestView::new(black_box(&uri), black_box(&headers));
                black_box(set.evaluate(&view).map(|d| d.into_stain()))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench, bench_split);
criterion_main!(benches);
