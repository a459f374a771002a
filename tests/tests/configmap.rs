//! Rules and instances mounted from a Kubernetes ConfigMap: the files are symlinks through
//! `..data`, and every update swaps `..data` to a new timestamped directory by renaming a
//! new symlink over it, then removes the old directory (`gray_test_support::configmap`).
//! `LiveRules` and the `Registry`, each following a `FileSource` on the mounted path, take
//! every version, keep the last good one when a version is invalid, and never read the
//! removed directory.

#![cfg(unix)]

use std::time::Duration;

use gray_discovery::{Registry, ServiceInstances, source::file::FileSource};
use gray_test_support::{WAIT, configmap::ConfigMap};
use gray_tests::{capture_logs, until};
use gray_tower::edge::LiveRules;

/// How often the tests' sources poll the file.
const POLL: Duration = Duration::from_millis(10);

fn rule(name: &str, lane: &str) -> String {
    format!(
        "[[rules]]\nname = \"{name}\"\nwhen = {{ header = {{ name = \"x-user\", exact = \"{name}\" }} }}\nlane = \"{lane}\"\n"
    )
}

#[tokio::test]
async fn live_rules_follow_a_configmap_swap() {
    let mut map = ConfigMap::mount("configmap-rules", &[("rules.toml", &rule("one", "gray"))]);
    let source = FileSource::new(map.path("rules.toml")).with_interval(POLL);
    let live = LiveRules::from_source(&source, None)
        .await
        .expect("the first version is read");
    let watch = live.follow(&source, None);
    let mut status = live.subscribe();
    let names = |live: &LiveRules| -> Vec<String> {
        let snapshot = live.load();
        let rules = snapshot.rules().rules();
        rules
            .iter()
            .map(|r| r.name().unwrap_or("").to_owned())
            .collect()
    };
    assert_eq!(names(&live), ["one"]);

    // A new version, with a second rule.
    map.update(&[(
        "rules.toml",
        &[rule("two", "gray"), rule("three", "blue")].concat(),
    )]);
    tokio::time::timeout(WAIT, status.wait_for(|s| s.generation == 2))
        .await
        .expect("the swap is taken within the bound")
        .expect("the rules live");
    assert_eq!(names(&live), ["two", "three"]);

    // An invalid version is rejected, naming the mounted file and the field; the last good
    // one stays in force.
    map.update(&[("rules.toml", &rule("four", "not a lane"))]);
    tokio::time::timeout(WAIT, status.wait_for(|s| s.rejected == 1))
        .await
        .expect("the swap is read within the bound")
        .expect("the rules live");
    let rejected = live.status();
    let error = rejected.last_error.clone().expect("the rejection's reason");
    assert!(
        error.contains("rules.toml") && error.contains("lane"),
        "{error}"
    );
    assert_eq!(
        (rejected.generation, names(&live)),
        (2, vec!["two".into(), "three".into()])
    );

    // And the next good one is taken.
    map.update(&[("rules.toml", &rule("five", "gray"))]);
    tokio::time::timeout(WAIT, status.wait_for(|s| s.generation == 3))
        .await
        .expect("the swap is taken within the bound")
        .expect("the rules live");
    assert_eq!(names(&live), ["five"]);
    assert!(watch.status().connected, "{:?}", watch.status());
}

fn instances(list: &[(&str, u16, &str)]) -> String {
    list.iter()
        .map(|(id, port, labels)| {
            format!("[[services.orders]]\nid = \"{id}\"\naddress = \"127.0.0.1:{port}\"\nlabels = {{ {labels} }}\n\n")
        })
        .collect()
}

fn held(orders: &ServiceInstances) -> Vec<String> {
    let mut held: Vec<String> = orders
        .instances()
        .iter()
        .map(|i| format!("{} {} {:?}", i.id(), i.address(), i.labels().get("gray")))
        .collect();
    held.sort();
    held
}

// A current-thread runtime: the registry's task runs on this thread, under the captured
// subscriber.
#[tokio::test(flavor = "current_thread")]
async fn a_registry_follows_a_configmap_swap() {
    let (logs, _guard) = capture_logs();
    let mut map = ConfigMap::mount(
        "configmap-instances",
        &[("instances.toml", &instances(&[("a", 1, ""), ("b", 2, "")]))],
    );
    let source = FileSource::new(map.path("instances.toml")).with_interval(POLL);
    let registry = Registry::start(source).await.expect("the registry starts");
    let orders = registry.service("orders").expect("a valid name");
    assert_eq!(held(&orders), ["a 127.0.0.1:1 None", "b 127.0.0.1:2 None"]);

    // b made gray, a gone, c new: one swap.
    map.update(&[(
        "instances.toml",
        &instances(&[("b", 2, "gray = \"true\""), ("c", 3, "")]),
    )]);
    let expected = ["b 127.0.0.1:2 Some(\"true\")", "c 127.0.0.1:3 None"];
    until(WAIT, "the swapped instances", || held(&orders) == expected).await;

    // An invalid version is rejected, naming the mounted file; the last good set stays.
    // Then the next good one is taken.
    map.update(&[(
        "instances.toml",
        "[[services.orders]]\nid = \"d\"\naddress = \"127.0.0.1:two\"\n",
    )]);
    let rejected = logs.line("instance file rejected").await;
    assert!(rejected.contains("instances.toml"), "{rejected}");
    assert_eq!(held(&orders), expected);
    map.update(&[("instances.toml", &instances(&[("e", 5, "")]))]);
    until(WAIT, "the next swap", || {
        held(&orders) == ["e 127.0.0.1:5 None"]
    })
    .await;
}
