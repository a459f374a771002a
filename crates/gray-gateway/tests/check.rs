//! `gray-gateway --check CONFIG`, run as a user would: the real binary, real files.

use std::{path::Path, process::Command};

use gray_test_support::TempDir;

/// Runs `gray-gateway --check <config>`: exit code, stdout, stderr.
fn check(config: &Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gray-gateway"))
        .arg("--check")
        .arg(config)
        .output()
        .expect("run gray-gateway");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const CONFIG: &str = r#"listen = "127.0.0.1:8080"
admin = "127.0.0.1:9901"
rules = "rules.toml"
instances = "instances.yaml"
max_connections = 100

[services.orders]
preset = "seed-000"
fallback = "any"

[services.stock]
pick = "round-robin"
"#;

const RULES: &str = r#"[[rules]]
name = "testers"
when = { header = { name = "x-tester", present = true } }
lane = "gray"

[[rules]]
name = "10% of users"
when = { sticky = { by = { cookie = "uid" }, percent = 10 } }
lane = "gray"
"#;

const INSTANCES: &str = "services:
  orders:
    - id: orders-1
      address: 127.0.0.1:9001
    - id: orders-2
      address: 127.0.0.1:9002
      labels: { gray: \"true\" }
";

fn write(dir: &TempDir, config: &str, rules: &str, instances: &str) -> std::path::PathBuf {
    std::fs::write(dir.path().join("rules.toml"), rules).unwrap();
    std::fs::write(dir.path().join("instances.yaml"), instances).unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    path
}

#[test]
fn a_good_config_exits_0_and_says_what_would_run() {
    let dir = TempDir::new("check-good");
    let (code, out, err) = check(&write(&dir, CONFIG, RULES, INSTANCES));
    assert_eq!(code, 0, "{out}{err}");
    for expected in [
        "the configuration is valid",
        "listen 127.0.0.1:8080, admin 127.0.0.1:9901 (the page at /",
        "max_connections 100 (idle ones drop their buffers at once above 1000)",
        "client limits: request_body_timeout 30000 ms (min rate 500 bytes/s), send_timeout 60000 ms, max_in_flight 4096, per client off",
        "carriers: lane x-gray-lane, route x-gray-info",
        "rules.toml: 2 rules",
        "instances.yaml",
        // Effective policies: the preset's settings spelled out, with the table's overrides.
        "orders: 2 instances, policy `seed-000`, pick peak-ewma",
        "fallback = \"any\"",
        "lane_key = false",
        "stock: 0 instances, policy `default`, pick round-robin",
        // Retries and health checks, the defaults spelled out.
        "retry up to 2 times within 20 % of 10 s + 10/s, after a broken connection for GET HEAD OPTIONS TRACE PUT DELETE, bodies up to 65536 bytes",
        "eject after 5 connection errors (a refusal: at once), probe connect within 1000 ms, first after 1000 ms, up to 60000 ms",
        // How the instances are reached, the defaults spelled out.
        "upstream: protocol http1, TLS for `https://` instances (system roots), /orders/x forwarded as /x",
    ] {
        assert!(out.contains(expected), "`{expected}` in:\n{out}");
    }
}

#[test]
fn an_admin_others_can_reach_without_a_token_is_warned_about() {
    let dir = TempDir::new("check-admin");
    let open = CONFIG.replace("admin = \"127.0.0.1:9901\"", "admin = \"0.0.0.0:9901\"");
    let (code, out, err) = check(&write(&dir, &open, RULES, INSTANCES));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("admin 0.0.0.0:9901 (the page at /"), "{out}");
    assert!(
        out.contains(
            "warning: the admin address 0.0.0.0:9901 is not loopback and has no `admin_token`"
        ),
        "{out}"
    );
    // with a token, or on loopback, no warning
    let guarded = open.replace(
        "admin = \"0.0.0.0:9901\"",
        "admin = \"0.0.0.0:9901\"\nadmin_token = \"a-long-enough-admin-token\"",
    );
    let (code, out, err) = check(&write(&dir, &guarded, RULES, INSTANCES));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("a token for commands)"), "{out}");
    assert!(!out.contains("warning: the admin address"), "{out}");
    assert!(
        !out.contains("a-long-enough-admin-token"),
        "the token is never printed: {out}"
    );
    let (_, out, _) = check(&write(&dir, CONFIG, RULES, INSTANCES));
    assert!(!out.contains("warning: the admin address"), "{out}");
}

#[test]
fn each_bad_file_exits_non_zero_with_its_error() {
    for (what, config, rules, instances, expected) in [
        (
            "config",
            CONFIG.replace("fallback = \"any\"", "falback = \"any\""),
            RULES.to_owned(),
            INSTANCES.to_owned(),
            "gateway.toml:9:1: field `services.orders.falback`: unknown field `falback`",
        ),
        (
            "rules",
            CONFIG.to_owned(),
            RULES.replace("percent = 10", "percent = 150"),
            INSTANCES.to_owned(),
            "rules.toml:8:",
        ),
        (
            "instances",
            CONFIG.to_owned(),
            RULES.to_owned(),
            INSTANCES.replace("address: 127.0.0.1:9002", "adress: 127.0.0.1:9002"),
            "instances.yaml:",
        ),
        (
            "an empty instances file",
            CONFIG.to_owned(),
            RULES.to_owned(),
            String::new(),
            "instances.yaml",
        ),
    ] {
        let dir = TempDir::new("check-bad");
        let (code, out, err) = check(&write(&dir, &config, &rules, &instances));
        assert_eq!(code, 1, "{what}: {out}{err}");
        assert!(out.is_empty(), "{what}: {out}");
        assert!(err.contains(expected), "{what}: `{expected}` in:\n{err}");
        assert!(
            err.contains("the configuration is invalid"),
            "{what}: {err}"
        );
    }
}

#[test]
fn a_missing_file_is_an_error_too() {
    let dir = TempDir::new("check-missing");
    let (code, _, err) = check(&dir.path().join("nope.toml"));
    assert_eq!(code, 1);
    assert!(err.contains("nope.toml: cannot read it"), "{err}");
}

#[test]
fn a_rollout_is_checked_against_the_rules_and_its_keys() {
    let dir = TempDir::new("check-rollout");
    let rollout = |table: &str| format!("{CONFIG}\n[services.orders.rollout]\n{table}");
    // valid: printed with its keys
    let path = write(
        &dir,
        &rollout(
            "rule = \"10% of users\"\nsteps = [5, 50, 100]\nhold_ms = 3000\nmin_users = 20\nalpha = 0.01\n",
        ),
        RULES,
        INSTANCES,
    );
    let (code, out, err) = check(&path);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("rollout: rule `10% of users`, steps 5, 50, 100 %, hold 3000 ms, min users 20, gates [], alpha 0.01"),
        "{out}"
    );
    assert!(out.contains("rollouts: state in"), "{out}");
    // the users each step needs before it may advance; no warning without users_per_s
    assert!(
        out.contains(
            "a step needs about this many gray users (clean baseline): 5 %: 310, 50 %: 891"
        ),
        "{out}"
    );
    assert!(!out.contains("warning:"), "{out}");
    // with the traffic stated, holds shorter than a step needs are warned of, step by step
    let path = write(
        &dir,
        &rollout(
            "rule = \"10% of users\"\nsteps = [5, 50, 100]\nhold_ms = 3000\nusers_per_s = 200\n",
        ),
        RULES,
        INSTANCES,
    );
    let (code, out, err) = check(&path);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("warning: the 5 % step needs about 31 s to see 310 gray users at users_per_s = 200, more than hold_ms = 3000"),
        "{out}"
    );
    // 891 / (200 × 50 %) = 9 s
    assert!(
        out.contains("warning: the 50 % step needs about 9 s"),
        "{out}"
    );

    // the rule is not a sticky-percentage rule: file, line and field
    let path = write(&dir, &rollout("rule = \"testers\"\n"), RULES, INSTANCES);
    let (code, _, err) = check(&path);
    assert_eq!(code, 1);
    let line = rollout("").lines().count() + 1;
    assert!(
        err.contains(&format!("gateway.toml:{line}:"))
            && err.contains("services.orders.rollout.rule"),
        "{err}"
    );
    // no such rule
    let path = write(&dir, &rollout("rule = \"canary\"\n"), RULES, INSTANCES);
    let (code, _, err) = check(&path);
    assert_eq!(code, 1);
    assert!(
        err.contains("services.orders.rollout.rule") && err.contains("canary"),
        "{err}"
    );

    // a bad key and a bad value, each at its line and field
    for (table, field) in [
        (
            "rule = \"10% of users\"\nhold = 3\n",
            "services.orders.rollout.hold",
        ),
        (
            "rule = \"10% of users\"\nsteps = [50, 10]\n",
            "services.orders.rollout.steps",
        ),
        (
            "rule = \"10% of users\"\nalpha = 2.0\n",
            "services.orders.rollout.alpha",
        ),
        (
            "rule = \"10% of users\"\ndetect = { power = 1.5 }\n",
            "services.orders.rollout.detect",
        ),
    ] {
        let path = write(&dir, &rollout(table), RULES, INSTANCES);
        let (code, _, err) = check(&path);
        assert_eq!(code, 1, "{table}");
        let line = rollout("").lines().count() + 2;
        assert!(
            err.contains(&format!("gateway.toml:{line}:")) && err.contains(field),
            "{table}: {err}"
        );
    }
}

// === [tls] ===

mod tls {
    use std::time::{Duration, SystemTime};

    use gray_test_support::{
        TempDir,
        tls::{Ca, Leaf},
    };

    use super::{INSTANCES, RULES, check, write};

    const DAY: Duration = Duration::from_secs(86_400);

    /// `CONFIG` with a `[tls]` table over `cert.pem` and `key.pem` (and `extra` keys).
    fn config(extra: &str) -> String {
        format!(
            "listen = \"127.0.0.1:8080\"\nrules = \"rules.toml\"\ninstances = \"instances.yaml\"\n\n[tls]\nlisten = \"127.0.0.1:8443\"\ncert_file = \"cert.pem\"\nkey_file = \"key.pem\"\n{extra}\n[services.orders]\n"
        )
    }

    #[test]
    fn a_good_pair_is_described() {
        let dir = TempDir::new("check-tls-good");
        let ca = Ca::new("check CA");
        let now = SystemTime::now();
        let server = ca.issue(
            &Leaf::server(&["localhost"]).with_validity(now - DAY, now + 30 * DAY + DAY / 2),
        );
        std::fs::write(dir.path().join("cert.pem"), server.chain_pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), server.key_pem()).unwrap();
        ca.write(dir.path(), "clients");
        let path = write(
            &dir,
            &config("client_ca_file = \"clients.pem\"\nclient_auth = \"optional\"\n"),
            RULES,
            INSTANCES,
        );
        let (code, out, err) = check(&path);
        assert_eq!(code, 0, "{out}{err}");
        for expected in [
            "listen 127.0.0.1:8080, tls 127.0.0.1:8443",
            "cert.pem (a chain of 2), valid until ",
            "(30 days left)",
            "TLS 1.2 and 1.3, ALPN h2 and http/1.1, client certificates optional (",
            "clients.pem: 1 CA)",
        ] {
            assert!(out.contains(expected), "`{expected}` in:\n{out}");
        }
    }

    #[test]
    fn each_unusable_file_exits_non_zero_naming_it_and_why() {
        let ca = Ca::new("check CA");
        let good = ca.issue(&Leaf::server(&["localhost"]));
        let other = ca.issue(&Leaf::server(&["localhost"]));
        let now = SystemTime::now();
        let expired =
            ca.issue(&Leaf::server(&["localhost"]).with_validity(now - 30 * DAY, now - DAY));
        let early =
            ca.issue(&Leaf::server(&["localhost"]).with_validity(now + DAY, now + 30 * DAY));
        for (what, cert, key, expected) in [
            (
                "a key of another certificate",
                Some(good.cert_pem().to_owned()),
                Some(other.key_pem().to_owned()),
                "tls.key_file",
            ),
            (
                "an expired certificate",
                Some(expired.cert_pem().to_owned()),
                Some(expired.key_pem().to_owned()),
                "cert.pem: the certificate expired on ",
            ),
            (
                "a certificate not valid yet",
                Some(early.cert_pem().to_owned()),
                Some(early.key_pem().to_owned()),
                "cert.pem: the certificate is not valid yet: valid from ",
            ),
            (
                "a missing certificate",
                None,
                Some(good.key_pem().to_owned()),
                "cert.pem: cannot read it",
            ),
            (
                "a certificate that is not PEM",
                Some("just some text\n".to_owned()),
                Some(good.key_pem().to_owned()),
                "cert.pem: not PEM, or nothing usable in it: expected a `-----BEGIN CERTIFICATE-----` block",
            ),
            (
                "a key that is not PEM",
                Some(good.cert_pem().to_owned()),
                Some(good.cert_pem().to_owned()),
                "key.pem: not PEM, or nothing usable in it: expected a `-----BEGIN PRIVATE KEY-----` block",
            ),
        ] {
            let dir = TempDir::new("check-tls-bad");
            if let Some(cert) = cert {
                std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
            }
            if let Some(key) = key {
                std::fs::write(dir.path().join("key.pem"), key).unwrap();
            }
            let (code, out, err) = check(&write(&dir, &config(""), RULES, INSTANCES));
            assert_eq!(code, 1, "{what}: {out}{err}");
            assert!(err.contains(expected), "{what}: `{expected}` in:\n{err}");
            if what.starts_with("a key of another") {
                assert!(
                    err.contains(
                        "key.pem: the private key does not match the certificate (the first of "
                    ),
                    "{what}: {err}"
                );
            }
        }
    }

    #[test]
    fn the_table_is_strict() {
        let dir = TempDir::new("check-tls-keys");
        for (what, extra, expected) in [
            (
                "an unknown key",
                "min_versoin = \"1.3\"\n",
                "field `tls.min_versoin`: unknown field",
            ),
            (
                "client_auth without a CA",
                "client_auth = \"required\"\n",
                "tls.client_auth",
            ),
            (
                "a version that does not exist",
                "min_version = \"1.1\"\n",
                "tls.min_version",
            ),
        ] {
            let (code, out, err) = check(&write(&dir, &config(extra), RULES, INSTANCES));
            assert_eq!(code, 1, "{what}: {out}{err}");
            assert!(err.contains("gateway.toml:"), "{what}: {err}");
            assert!(err.contains(expected), "{what}: `{expected}` in:\n{err}");
        }
    }
}

#[test]
fn a_mirror_is_printed_and_unsafe_methods_are_warned_of() {
    let dir = TempDir::new("check-mirror");
    let mirror = |table: &str| format!("{CONFIG}\n[services.orders.mirror]\n{table}");
    let path = write(
        &dir,
        &mirror("lane = \"gray\"\npercent = 50\n"),
        RULES,
        INSTANCES,
    );
    let (code, out, err) = check(&path);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("mirror: 50 % of baseline's GET, HEAD to lane `gray` (no fallback), bodies up to 65536 bytes, 256 in flight, 5000 ms each, answers compared up to 1048576 bytes"),
        "{out}"
    );
    assert!(
        out.contains("copies shed while the gateway's worker threads want the CPU over 75 % of their time (mirror_max_busy)"),
        "{out}"
    );
    assert!(!out.contains("warning:"), "{out}");
    let path = write(
        &dir,
        &mirror("lane = \"gray\"\nmethods = [\"GET\", \"post\"]\n"),
        RULES,
        INSTANCES,
    );
    let (code, out, err) = check(&path);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("warning: the mirror copies unsafe methods"),
        "{out}"
    );
    // A rollout's shadow phase is printed; without a mirror it is refused.
    let shadowed = format!(
        "{CONFIG}\n[services.orders.mirror]\nlane = \"gray\"\n[services.orders.rollout]\nrule = \"10% of users\"\nshadow = {{ hold_ms = 30000, min_requests = 400 }}\n"
    );
    let path = write(&dir, &shadowed, RULES, INSTANCES);
    let (code, out, err) = check(&path);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "a shadow phase first (copies only, weight 0): at least 30000 ms and 400 copies judged"
        ),
        "{out}"
    );
    let unmirrored = shadowed.replace("[services.orders.mirror]\nlane = \"gray\"\n", "");
    let path = write(&dir, &unmirrored, RULES, INSTANCES);
    let (code, _, err) = check(&path);
    assert_eq!(code, 1);
    assert!(err.contains("services.orders.rollout.shadow"), "{err}");
    // A mistake names its field.
    let path = write(&dir, &mirror("lane = \"baseline\"\n"), RULES, INSTANCES);
    let (code, _, err) = check(&path);
    assert_eq!(code, 1);
    assert!(err.contains("services.orders.mirror.lane"), "{err}");
}
