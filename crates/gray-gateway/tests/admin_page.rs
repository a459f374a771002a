//! The admin page in a real browser (Debian's headless Chromium, over WebDriver), against
//! the gateway binary with a real rollout and real traffic: the page shows the rollout's
//! phase, weight and charts with points; an abort clicked on the page, once confirmed,
//! rolls the rollout back, but not without the `admin_token`; the page loads nothing from
//! another host and breaks no rule of its Content-Security-Policy; "where would this
//! request go?" answers; and with `admin_token_for_reads` the page asks for the token once.
//!
//! `GRAY_SCREENSHOT=path.png` writes a screenshot of the rolled-back rollout there (the
//! README's).

mod rollouts;

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use gray_test_support::{TempDir, browser::Browser};
use rollouts::{Addrs, admin, admin_with, load, process::Process, stop_load, wait_for};
use serde_json::json;

const TOKEN: &str = "page-token-0123456789abcdef";

/// Generous: two cores shared with the whole suite, a debug gateway and a browser.
const WITHIN: Duration = Duration::from_secs(60);

/// A gateway process with a rollout of `svc` (steps 10, 50, 100, a long hold), with
/// `access` after `admin = …`.
async fn gateway(tag: &str, access: &str) -> (Process, TempDir) {
    let (dir, _gray, _base) = rollouts::files(
        tag,
        "interval_ms = 200\n",
        "steps = [10, 50, 100]\nhold_ms = 600000\nmin_users = 10\n",
    )
    .await;
    rollouts::add_top_level(&dir, access);
    (Process::start(&dir).await, dir)
}

/// Types the token into the page's open token dialog, and saves it.
async fn enter_token(browser: &Browser) {
    let input = browser.wait_for("#token-input", WITHIN).await;
    browser.send_keys(&input, TOKEN).await;
    browser
        .click(&browser.wait_for("#token-save", WITHIN).await)
        .await;
}

/// Clicks the rollout's `command` button and accepts the confirmation it asks for.
async fn command(browser: &Browser, command: &str) {
    let button = browser
        .wait_for(
            &format!("#rollout-svc button[data-command=\"{command}\"]"),
            WITHIN,
        )
        .await;
    browser.click(&button).await;
    let mut asked = None;
    for _ in 0..200 {
        asked = browser.alert_text().await;
        if asked.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let asked = asked.expect("the page asks for a confirmation");
    assert!(asked.contains("the rollout of svc"), "{asked}");
    browser.accept_alert().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_a_rollout_and_aborts_it_only_with_the_token() {
    let (gw, _dir) = gateway("admin-page", &format!("admin_token = \"{TOKEN}\"\n")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (_seen, tasks) = load(&gw, 200, 2, false, stop.clone());
    let auth = format!("Bearer {TOKEN}");
    let (status, _, view) =
        admin_with(&gw, "POST", "/rollouts/svc", &[("authorization", &auth)]).await;
    assert_eq!(status, 200, "{view}");

    let browser = Browser::start().await;
    let origin = format!("http://{}", gw.admin());
    browser.goto(&format!("{origin}/")).await;
    // the rollout's phase and weight
    browser
        .wait_for("#rollout-svc .phase[data-phase=\"step\"]", WITHIN)
        .await;
    let weight = browser.wait_for("#rollout-svc .weight", WITHIN).await;
    assert_eq!(browser.text(&weight).await, "gray 10 %");
    let current = browser
        .wait_for("#rollout-svc ol.steps li.current", WITHIN)
        .await;
    assert_eq!(browser.text(&current).await, "10 %");
    // its charts have points, drawn on canvases
    browser
        .wait_until(
            "const c = window.gray.charts['rollout-svc-weight']; \
             return !!c && c.plot.data[0].length >= 2 && c.plot.data[1].some(w => w === 10);",
            WITHIN,
            "the weight chart has points at 10 %",
        )
        .await;
    browser
        .wait_until(
            "const c = window.gray.charts['rollout-svc-evidence']; \
             return !!c && c.plot.data[0].length >= 2;",
            WITHIN,
            "the evidence chart has points",
        )
        .await;
    browser
        .wait_until(
            "const c = window.gray.charts['service-svc-requests']; \
             return !!c && c.plot.series.length === 3 && c.plot.data[1].some(v => v > 0);",
            WITHIN,
            "the requests chart has both lanes, with traffic",
        )
        .await;
    assert!(
        browser
            .find("#rollout-svc .weight-chart canvas")
            .await
            .is_some()
    );
    // the service's instances, by lane
    let rows = browser.find_all("#service-svc tr.instance").await;
    let mut instances = Vec::new();
    for row in &rows {
        instances.push(browser.text(row).await);
    }
    instances.sort();
    assert_eq!(instances.len(), 2, "{instances:?}");
    assert!(
        instances[0].starts_with("baseline")
            && instances[0].contains("base-1")
            && instances[0].ends_with("ready"),
        "{instances:?}"
    );
    assert!(
        instances[1].starts_with("gray") && instances[1].contains("gray-1"),
        "{instances:?}"
    );

    // an abort without the token: refused, the page asks for the token, nothing changes
    command(&browser, "abort").await;
    browser.wait_for("#token-dialog[open]", WITHIN).await;
    let result = browser
        .wait_for("#rollout-svc .command-result.error", WITHIN)
        .await;
    assert!(
        browser.text(&result).await.contains("abort refused"),
        "the page says so"
    );
    let (_, view) = admin(&gw, "GET", "/rollouts/svc").await;
    assert_eq!(
        (view["phase"].as_str(), view["weight"].as_f64()),
        (Some("step"), Some(10.0)),
        "{view}"
    );
    // with the token typed in once, the abort goes through
    enter_token(&browser).await;
    // a pause first, said in words
    command(&browser, "pause").await;
    browser
        .wait_for("#rollout-svc .phase[data-phase=\"paused\"]", WITHIN)
        .await;
    browser
        .wait_until(
            "return document.querySelector('#rollout-svc .facts').textContent.includes('paused: by an operator');",
            WITHIN,
            "the page says who paused it",
        )
        .await;
    command(&browser, "abort").await;
    browser
        .wait_for("#rollout-svc .phase[data-phase=\"rolled_back\"]", WITHIN)
        .await;
    let view = wait_for(&gw, WITHIN, |v| v["phase"] == "rolled_back").await;
    assert_eq!(view["weight"].as_f64(), Some(0.0));
    assert_eq!(
        view["last_transition"]["reason"]["kind"], "abort",
        "{view:#}"
    );
    let transition = browser
        .wait_for("#rollout-svc ol.transitions li.reason-abort", WITHIN)
        .await;
    assert!(
        browser
            .text(&transition)
            .await
            .contains("aborted by an operator"),
        "the reason, in words"
    );

    // where would a tester's request go?
    let path = browser.wait_for("#explain-path", WITHIN).await;
    browser.clear(&path).await;
    browser.send_keys(&path, "/svc/x").await;
    let headers = browser.wait_for("#explain-headers", WITHIN).await;
    browser.send_keys(&headers, "x-tester: 1").await;
    browser
        .click(&browser.wait_for("#explain-submit", WITHIN).await)
        .await;
    let summary = browser.wait_for("#explain-summary", WITHIN).await;
    let summary = browser.text(&summary).await;
    assert!(
        summary.contains("Lane gray (decided by rule testers)") && summary.contains("svc: gray-1"),
        "{summary}"
    );

    // nothing came from another host, and nothing broke the page's policy
    let resources = browser
        .execute(
            "return performance.getEntriesByType('resource').map(e => e.name);",
            vec![],
        )
        .await;
    let resources: Vec<String> = serde_json::from_value(resources).unwrap();
    assert!(!resources.is_empty());
    assert!(
        resources.iter().all(|r| r.starts_with(&origin)),
        "{resources:?}"
    );
    let violations = browser
        .execute("return window.gray.cspViolations;", vec![])
        .await;
    assert_eq!(violations, json!([]), "the CSP let the page work");
    // the policy is the one the page is served with, and it is enforced: a script from
    // elsewhere is refused
    let (_, head, _) = admin_with(&gw, "GET", "/", &[]).await;
    assert!(
        head["content-security-policy"]
            .to_str()
            .unwrap()
            .starts_with("default-src 'self'")
    );
    browser
        .execute(
            "const s = document.createElement('script'); s.src = 'http://192.0.2.1/x.js'; \
             document.head.append(s); return true;",
            vec![],
        )
        .await;
    browser
        .wait_until(
            "return window.gray.cspViolations.some(v => v.includes('192.0.2.1'));",
            WITHIN,
            "the policy refuses a script from another host",
        )
        .await;
    let errors: Vec<_> = browser
        .console_log()
        .await
        .into_iter()
        .filter(|e| {
            let message = e["message"].as_str().unwrap_or("");
            // the refused abort (401) and the refused script were meant
            e["level"] == "SEVERE"
                && !message.contains("192.0.2.1")
                && !message.contains("/rollouts/svc/abort - Failed to load resource: the server responded with a status of 401")
        })
        .collect();
    assert!(errors.is_empty(), "the page logged errors: {errors:?}");

    if let Some(path) = std::env::var_os("GRAY_SCREENSHOT") {
        browser
            .execute("window.scrollTo(0, 0); return true;", vec![])
            .await;
        std::fs::write(path, browser.screenshot().await).unwrap();
    }
    let png = browser.screenshot().await;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    drop(browser);
    stop_load(&stop, tasks).await;
    gw.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_for_reads_the_page_asks_for_it_once() {
    let (gw, _dir) = gateway(
        "admin-page-reads",
        &format!("admin_token = \"{TOKEN}\"\nadmin_token_for_reads = true\n"),
    )
    .await;
    let browser = Browser::start().await;
    browser.goto(&format!("http://{}/", gw.admin())).await;
    // the page loads (its files are open), then asks for the token to read anything
    browser.wait_for("#token-dialog[open]", WITHIN).await;
    let status = browser.wait_for("#status.error", WITHIN).await;
    assert!(browser.text(&status).await.contains("needs its token"));
    assert!(
        browser.find("#rollout-svc").await.is_none(),
        "nothing is shown without it"
    );
    enter_token(&browser).await;
    browser
        .wait_for("#rollout-svc .phase[data-phase=\"pending\"]", WITHIN)
        .await;
    // once: the polls go on with it, and a reload of the tab keeps it
    browser
        .wait_until(
            "return window.gray.polls >= 3;",
            WITHIN,
            "three polls with the token",
        )
        .await;
    browser.goto(&format!("http://{}/", gw.admin())).await;
    browser
        .wait_for("#rollout-svc .phase[data-phase=\"pending\"]", WITHIN)
        .await;
    assert!(browser.find("#token-dialog[open]").await.is_none());
    drop(browser);
    gw.terminate().await;
}
