//! Heap allocations of a decision, counted by a global allocator: a sticky split by a header,
//! a cookie or the client IP, like a sticky percentage, decides without allocating (a match
//! clones a stain built at load time).

use gray_rules::{Format, RequestView, RuleSet};
use gray_test_support::alloc::{Counting, measure};
use http::{HeaderMap, HeaderValue, Uri};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn sticky_decisions_allocate_nothing() {
    let arms = r#"[{"weight":80},{"weight":15,"lane":"canary-1"},{"weight":5,"lane":"canary-2"}]"#;
    let set = |json: String| RuleSet::parse(&json, Format::Json, "alloc").expect("valid rules");
    let rules = [
        set(format!(r#"{{"rules":[{{"split":{{"by":{{"header":"x-user-id"}},"salt":"s","arms":{arms}}}}}]}}"#)),
        set(format!(r#"{{"rules":[{{"split":{{"by":{{"cookie":"uid"}},"arms":{arms}}}}}]}}"#)),
        set(format!(r#"{{"rules":[{{"split":{{"by":"client_ip","arms":{arms}}}}}]}}"#)),
        set(r#"{"rules":[{"when":{"sticky":{"by":{"header":"x-user-id"},"percent":50}},"lane":"canary-1"}]}"#.to_owned()),
    ];
    let uri = Uri::from_static("/checkout");
    let mut headers = HeaderMap::new();
    headers.insert("cookie", HeaderValue::from_static("a=b; uid=user-7"));
    for i in 0..100 {
        headers.insert(
            "x-user-id",
            HeaderValue::from_str(&format!("user-{i}")).unwrap(),
        );
        for (rules, what) in rules
            .iter()
            .zip(["by header", "by cookie", "by client IP", "percent"])
        {
            let view = RequestView::new(&uri, &headers).with_client_ip(Some([10, 0, 0, 7].into()));
            let (decided, n) = measure(|| rules.evaluate(&view).map(|d| d.into_stain()));
            drop(decided);
            assert_eq!(n, 0, "a sticky {what}");
        }
    }
}

/// A rollout asks, per request, where it stands to its sticky-percentage rule: no
/// allocation either.
#[test]
fn a_sticky_arm_allocates_nothing() {
    let rules = RuleSet::parse(
        r#"{"rules":[{"name":"canary","when":{"path":{"prefix":"/checkout"},"sticky":{"by":{"header":"x-user-id"},"percent":30}},"lane":"gray"}]}"#,
        Format::Json,
        "alloc",
    )
    .expect("valid rules");
    let canary = rules
        .sticky_rule("canary")
        .expect("a sticky-percentage rule");
    let uri = Uri::from_static("/checkout");
    let mut headers = HeaderMap::new();
    let mut users = 0;
    for i in 0..100 {
        headers.insert(
            "x-user-id",
            HeaderValue::from_str(&format!("user-{i}")).unwrap(),
        );
        let view = RequestView::new(&uri, &headers);
        let (arm, n) = measure(|| canary.arm(&view));
        assert_eq!(n, 0, "user-{i}");
        users += usize::from(arm.user().is_some());
    }
    assert_eq!(users, 100);
}
