//! `gray-gateway --check CONFIG`: validates a configuration and every file it names, and
//! says what the gateway would run, like `nginx -t`.
//!
//! [`check`] reads the configuration file, then the rules file and the instances file it
//! names (each error names its file, line and field), and returns a summary: the listen
//! and admin addresses, the limits, the carriers, where rules and instances come from with
//! how many there are, and each service with its instances, its effective policy (every
//! setting spelled out, the preset's included), its retries and its health check, and how
//! its instances are reached (protocol, TLS). An
//! `[etcd]` table is checked as a table
//! only: etcd is not contacted, so its keys are neither read nor counted.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let dir = std::env::temp_dir().join(format!("gray-gateway-check-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! std::fs::write(dir.join("instances.toml"), "[[services.orders]]\nid = \"o-1\"\naddress = \"127.0.0.1:9\"\n")?;
//! std::fs::write(dir.join("gateway.toml"), "listen = \"127.0.0.1:8080\"\ninstances = \"instances.toml\"\n[services.orders]\npreset = \"seed-000\"\n")?;
//! let summary = gray_gateway::check::check(&dir.join("gateway.toml")).await?;
//! assert!(summary.contains("orders: 1 instance, policy `seed-000`"), "{summary}");
//!
//! std::fs::write(dir.join("instances.toml"), "[[services.orders]]\nid = \"o-1\"\nadress = \"127.0.0.1:9\"\n")?;
//! let err = gray_gateway::check::check(&dir.join("gateway.toml")).await.unwrap_err();
//! assert!(err.to_string().contains("instances.toml:3:1"), "{err}");
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), tower::BoxError>(())
//! # }).unwrap();
//! ```

use std::{fmt::Write, path::Path};

use gray_balance::Pick;
use gray_core::CarrierConfig;
use gray_discovery::{Registry, source::file::FileSource as InstanceFile};
use gray_policy::PolicyConfig;
use gray_tower::edge::{FileSource, LiveRules};
use tower::BoxError;

use crate::config::{Config, DEFAULT_INSTANCES, Discovery, Rules};

/// Checks the configuration at `path` and the files it names; see the [module docs](self).
pub async fn check(path: &Path) -> Result<String, BoxError> {
    let config = Config::load(path)?;
    let mut out = String::new();
    let _ = writeln!(out, "{}: the configuration is valid", path.display());
    match config.listen {
        Some(listen) => {
            let _ = write!(out, "listen {listen}");
        }
        None => {
            let _ = write!(out, "no plaintext listener");
        }
    }
    if let Some(tls) = &config.tls {
        let _ = write!(out, ", tls {}", tls.listen);
    }
    if let Some(admin) = config.admin {
        let _ = write!(
            out,
            ", admin {admin} (the page at /, /explain, /metrics, /healthz, /rollouts; {})",
            match (&config.admin_access.token, config.admin_access.for_reads) {
                (None, _) => "no token",
                (Some(_), false) => "a token for commands",
                (Some(_), true) => "a token for commands and reads",
            }
        );
    }
    let workers = match config.workers {
        0 => "one per core".to_owned(),
        1 => "1 (current-thread scheduler)".to_owned(),
        n => n.to_string(),
    };
    let _ = writeln!(out, ", workers {workers}");
    if let Some(warning) = open_admin(config.admin, &config.admin_access) {
        let _ = writeln!(out, "warning: {warning}");
    }
    let limits = config.limits;
    let ms = |d: Option<std::time::Duration>| {
        d.map_or("off".to_owned(), |d| format!("{} ms", d.as_millis()))
    };
    let _ = writeln!(
        out,
        "limits: header_read_timeout {}, max_header_bytes {}, idle_timeout {}, max_connections {} (idle ones drop their buffers at once above {}), upstream_timeout {} ms, head_hold {} ms",
        ms(limits.header_read_timeout),
        limits.max_header_bytes,
        ms(limits.idle_timeout),
        limits.max_connections,
        limits.release_buffers_above,
        config.upstream_timeout.as_millis(),
        config.head_hold.as_millis(),
    );
    let cap = |n: usize| {
        if n == 0 {
            "off".to_owned()
        } else {
            n.to_string()
        }
    };
    let _ = writeln!(
        out,
        "client limits: request_body_timeout {} (min rate {} bytes/s), send_timeout {}, max_in_flight {}, per client {}, per instance {}, max_cancelled_streams {}%, http2 streams {}, send buffer {} bytes, upstream connects {} per instance",
        ms(limits.request_body_timeout),
        limits.request_body_min_rate,
        ms(limits.send_timeout),
        cap(limits.max_in_flight),
        cap(limits.max_in_flight_per_client as usize),
        cap(limits.max_in_flight_per_instance as usize),
        limits.max_cancelled_streams_percent,
        limits.http2_max_concurrent_streams,
        limits.http2_max_send_buf_size,
        limits.upstream_max_connects,
    );
    let cidrs = |list: &gray_rules::CidrList| {
        list.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        out,
        "trusted clients [{}], trusted proxies [{}] (read from {})",
        cidrs(&config.trusted_clients),
        cidrs(&config.trusted_proxies),
        config.forwarded_header.header_name(),
    );
    let carriers: Vec<String> = config.carriers.iter().map(carrier).collect();
    let _ = writeln!(out, "carriers: {}", carriers.join(", "));
    if !config.strip.is_empty() {
        let strip: Vec<&str> = config.strip.iter().map(|h| h.as_str()).collect();
        let _ = writeln!(
            out,
            "also stripped from untrusted clients: {}",
            strip.join(", ")
        );
    }

    #[cfg(feature = "tls")]
    if let Some(tls) = &config.tls {
        tls_summary(&mut out, tls)?;
    }

    match &config.rules {
        Rules::File(path) => {
            let live = LiveRules::from_source(&FileSource::new(path), None).await?;
            // A rollout's rule must be one of them, a sticky-percentage rule.
            config.check_rollouts(live.load().rules())?;
            let n = live.load().rules().rules().len();
            let _ = writeln!(out, "rules: {}: {n} rule{}", path.display(), plural(n));
        }
        #[cfg(feature = "etcd")]
        Rules::Etcd(etcd, key) => {
            let _ = writeln!(
                out,
                "rules: etcd key {key} at {:?} ({}; not read: --check does not contact etcd)",
                etcd.client.endpoints(),
                crate::start::rules_format(key),
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "rules: none (requests are baseline unless a trusted client stains them)"
            );
        }
    }

    let registry = match &config.discovery {
        Discovery::File(path) => {
            let _ = writeln!(out, "instances: {}", path.display());
            Some(Registry::start(InstanceFile::new(path)).await?)
        }
        Discovery::Embedded => {
            let _ = writeln!(out, "instances: the embedded default file");
            let dir =
                std::env::temp_dir().join(format!("gray-gateway-check-{}", std::process::id()));
            let file = dir.with_extension("toml");
            std::fs::write(&file, DEFAULT_INSTANCES)?;
            let registry = Registry::start(InstanceFile::new(&file)).await;
            let _ = std::fs::remove_file(&file);
            Some(registry?)
        }
        #[cfg(feature = "etcd")]
        Discovery::Etcd(etcd) => {
            let _ = writeln!(
                out,
                "instances: etcd prefix {} at {:?} (not read: --check validates the [etcd] table only)",
                etcd.prefix,
                etcd.client.endpoints(),
            );
            None
        }
    };

    let _ = writeln!(out, "services:");
    for service in &config.services {
        let _ = write!(out, "  {}: ", service.name);
        if let Some(registry) = &registry {
            let n = registry.service(&service.name)?.instances().len();
            let _ = write!(out, "{n} instance{}, ", plural(n));
        }
        let _ = writeln!(
            out,
            "policy `{}`, pick {}",
            service.policy.name(),
            pick_name(service.pick)
        );
        let _ = writeln!(
            out,
            "    {}",
            settings(&PolicyConfig::from(&service.policy))
        );
        let _ = writeln!(out, "    {}", retry(service));
        let _ = writeln!(out, "    {}", transport(service));
        if let Some(m) = &service.mirror {
            let methods: Vec<&str> = m.methods.iter().map(http::Method::as_str).collect();
            let _ = writeln!(
                out,
                "    mirror: {} % of baseline's {} to lane `{}` (no fallback), bodies up to {} bytes, {} in flight, {} ms each, answers compared up to {} bytes",
                m.percent,
                methods.join(", "),
                m.lane,
                m.max_body_bytes,
                m.max_in_flight,
                m.timeout.as_millis(),
                m.max_compare_bytes,
            );
            let _ = writeln!(
                out,
                "    copies shed while the gateway's worker threads want the CPU over {} % of their time (mirror_max_busy)",
                config.mirror_max_busy * 100.0,
            );
            if m.methods.iter().any(|m| !m.is_safe()) {
                let _ = writeln!(
                    out,
                    "    warning: the mirror copies unsafe methods: the copies' own calls are real (see the docs, Mirroring: safety)"
                );
            }
        }
        if let Some(r) = &service.rollout {
            let steps: Vec<String> = r.steps.iter().map(f64::to_string).collect();
            let gates: Vec<String> = r.gates.iter().map(f64::to_string).collect();
            let _ = writeln!(
                out,
                "    rollout: rule `{}`, steps {} %, hold {} ms, min users {}, gates [{}], alpha {}",
                r.rule,
                steps.join(", "),
                r.hold.as_millis(),
                r.min_users,
                gates.join(", "),
                r.alpha,
            );
            if let Some(shadow) = &r.shadow {
                let _ = writeln!(
                    out,
                    "    rollout: a shadow phase first (copies only, weight 0): at least {} ms and {} copies judged with no alarm",
                    shadow.hold.as_millis(),
                    shadow.min_requests
                );
            }
            let _ = writeln!(out, "    {}", detection(r));
            for warning in short_holds(r) {
                let _ = writeln!(out, "    warning: {warning}");
            }
        }
    }
    if config.services.iter().any(|s| s.rollout.is_some()) {
        let r = &config.rollouts;
        match &config.discovery {
            #[cfg(feature = "etcd")]
            crate::config::Discovery::Etcd(etcd) => {
                let _ = writeln!(
                    out,
                    "rollouts: state in etcd under {}rollouts/, shared by the gateways of that \
                     etcd, a look every {} ms, lease {} ms, weight 0 after {} ms cut off",
                    etcd.prefix,
                    r.interval.as_millis(),
                    r.lease_ttl.as_millis(),
                    r.partition_hold.as_millis()
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "rollouts: state in {}, a look every {} ms",
                    r.state_dir.display(),
                    r.interval.as_millis()
                );
            }
        }
    }
    Ok(out)
}

/// `detection: …`: the gray users each step must see before it may advance.
fn detection(r: &gray_rollout::RolloutConfig) -> String {
    let d = &r.detect;
    if !d.is_enabled() {
        return "detection: steps advance on their hold and min_users alone (detect.power = 0)"
            .to_owned();
    }
    let steps: Vec<String> = r
        .users_to_detect()
        .iter()
        .map(|(w, n)| match n {
            Some(n) => format!("{w} %: {n}"),
            None => format!("{w} %: never"),
        })
        .collect();
    format!(
        "detection: to catch {}x baseline's errors or +{} of users with power {}, a step needs \
         about this many gray users (clean baseline): {}",
        d.ratio,
        d.min_rate,
        d.power,
        steps.join(", ")
    )
}

/// The steps whose hold is shorter than the time to see the users they need, at the
/// configured `users_per_s`.
fn short_holds(r: &gray_rollout::RolloutConfig) -> Vec<String> {
    let Some(rate) = r.users_per_s else {
        return Vec::new();
    };
    r.users_to_detect()
        .iter()
        .filter_map(|(w, n)| {
            let needed = (*n)? as f64 / (rate * w / 100.0);
            (needed > r.hold.as_secs_f64()).then(|| {
                format!(
                    "the {w} % step needs about {needed:.0} s to see {} gray users at \
                     users_per_s = {rate}, more than hold_ms = {}: it will wait for them \
                     (see docs/rollout.md, \"Promotion on evidence\")",
                    n.unwrap_or_default(),
                    r.hold.as_millis()
                )
            })
        })
        .collect()
}

/// `upstream: …`: the HTTP version and TLS of a service's instances.
fn transport(service: &crate::config::ServiceConfig) -> String {
    let t = &service.transport;
    let tls = match (&t.tls, t.insecure) {
        (None, _) => "TLS for `https://` instances (system roots)".to_owned(),
        (Some(_), true) => {
            "TLS to every instance, certificates NOT verified (insecure_skip_verify)".to_owned()
        }
        (Some(tls), false) => format!(
            "TLS to every instance{}",
            if tls.config().client_auth_cert_resolver.has_certs() {
                ", with a client certificate"
            } else {
                ""
            }
        ),
    };
    let path = if service.strip_prefix {
        format!("/{}/x forwarded as /x", service.name)
    } else {
        "the path forwarded as it came (strip_prefix = false)".to_owned()
    };
    format!("upstream: protocol {}, {tls}, {path}", t.protocol)
}

/// The `[tls]` table: its files read and checked as the gateway would at start-up.
#[cfg(feature = "tls")]
fn tls_summary(out: &mut String, tls: &crate::config::TlsSettings) -> Result<(), BoxError> {
    use std::time::SystemTime;

    use crate::tls::{Files, Utc, load};

    let loaded = load(tls, &Files::read(tls)?, SystemTime::now())?;
    let days = loaded.validity.remaining(SystemTime::now()).as_secs() / 86_400;
    let _ = writeln!(
        out,
        "tls: {} (a chain of {}), valid until {} ({days} day{} left), key {}",
        tls.cert_file.display(),
        loaded.chain,
        Utc(loaded.validity.not_after),
        plural(days as usize),
        tls.key_file.display(),
    );
    let versions = match tls.min_version {
        crate::config::TlsVersion::Tls13 => "TLS 1.3",
        _ => "TLS 1.2 and 1.3",
    };
    let clients = match (&tls.client_certs, loaded.client_cas) {
        (Some(client), Some(n)) => format!(
            "client certificates {} ({}: {n} CA{})",
            if client.required {
                "required"
            } else {
                "optional"
            },
            client.ca_file.display(),
            plural(n)
        ),
        _ => "no client certificates".to_owned(),
    };
    let ms = |d: Option<std::time::Duration>| {
        d.map_or("off".to_owned(), |d| format!("{} ms", d.as_millis()))
    };
    let _ = writeln!(
        out,
        "     {versions}, ALPN h2 and http/1.1, {clients}, handshake_timeout {}, reload_interval {}",
        ms(tls.handshake_timeout),
        ms(tls.reload_interval),
    );
    Ok(())
}

/// `retry: …; health check: …`: how a service's requests are retried and its instances
/// ejected and probed.
fn retry(service: &crate::config::ServiceConfig) -> String {
    let r = &service.retry;
    let retry = match r.max_retries() {
        0 => "retry off".to_owned(),
        n => {
            let methods: Vec<&str> = r.idempotent().iter().map(http::Method::as_str).collect();
            format!(
                "retry up to {n} times within {} % of {} s + {}/s, after a broken connection for {}, bodies up to {} bytes",
                r.budget_percent(),
                r.budget_window().as_secs(),
                r.min_per_second(),
                match methods.is_empty() {
                    true => "no method".to_owned(),
                    false => methods.join(" "),
                },
                r.max_replay_bytes()
            )
        }
    };
    let probe = match service.probe.check() {
        gray_balance::health::Check::None => "none".to_owned(),
        gray_balance::health::Check::Connect => "connect".to_owned(),
        gray_balance::health::Check::Http { path } => format!("http GET {path}"),
        gray_balance::health::Check::Grpc { service } => format!("grpc {service:?}"),
        _ => "other".to_owned(),
    };
    let e = &service.ejection;
    format!(
        "{retry}; eject after {} connection errors (a refusal: at once), probe {probe} within {} ms, first after {} ms, up to {} ms",
        e.consecutive(),
        service.probe.timeout().as_millis(),
        e.backoff().min().as_millis(),
        e.backoff().max().as_millis()
    )
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `fallback = "baseline", lane_key = "lane", …`: every setting of a policy.
fn settings(policy: &PolicyConfig) -> String {
    let value = serde_json::to_value(policy).unwrap_or_default();
    let Some(map) = value.as_object() else {
        return String::new();
    };
    map.iter()
        .filter(|(key, _)| *key != "name")
        .map(|(key, value)| match value {
            serde_json::Value::Null => format!("{key} = false"),
            value => format!("{key} = {value}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn pick_name(pick: Pick) -> &'static str {
    match pick {
        Pick::RoundRobin => "round-robin",
        Pick::PendingRequests => "pending-requests",
        _ => "peak-ewma",
    }
}

fn carrier(c: &CarrierConfig) -> String {
    let kind = match c {
        CarrierConfig::Flag { .. } => "flag",
        CarrierConfig::Lane { .. } => "lane",
        CarrierConfig::Version { .. } => "version",
        CarrierConfig::Route { .. } => "route",
        CarrierConfig::Baggage { .. } => "baggage member",
        _ => "carrier",
    };
    format!("{kind} {}", c.header())
}

/// The warning for an admin address others can reach without a token, if it is one.
fn open_admin(
    admin: Option<std::net::SocketAddr>,
    access: &crate::config::AdminAccess,
) -> Option<String> {
    let admin = admin?;
    if access.token.is_some() || admin.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "the admin address {admin} is not loopback and has no `admin_token`: anyone who reaches it can start, promote or abort a rollout (bind it to 127.0.0.1, or set `admin_token`)"
    ))
}
