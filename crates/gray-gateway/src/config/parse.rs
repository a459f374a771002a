//! Reading a configuration file into a [`Config`]: the file's form (`super::file`) is
//! deserialised, every value checked, and every mistake reported with the file, the line,
//! the column and the field.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use gray_config::{Document, Format};
use gray_core::CarrierConfig;
use gray_policy::Policy;
use gray_rules::CidrList;
use http::HeaderName;

use super::{model::millis, *};

/// The smallest `max_header_bytes`: hyper's smallest read buffer.
const MIN_HEADER_BYTES: usize = 8 * 1024;

/// Why an edge refuses `own_lane`.
const NO_OWN_LANE: &str = "a gateway has no own lane: every request it routes carries the stain \
    the edge decided (baseline when no rule fires), so an own lane would never apply; stain \
    requests with a rule instead";

impl Config {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(
                &path.display().to_string(),
                format_args!("cannot read it: {e}"),
            )
        })?;
        Self::parse(&text, path)
    }

    /// Parses and checks `text`, read from `path` (relative paths are resolved against
    /// its folder).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let source = path.display().to_string();
        let doc = Document::new(text, Format::Toml, &source);
        let raw: file::File = doc.parse().map_err(|e| located(&doc, e))?;
        let err = |field: &str, message: &dyn std::fmt::Display| doc.error(field, message);
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };

        let trusted_clients =
            CidrList::parse(&raw.trusted_clients).map_err(|e| err("trusted_clients", &e))?;
        let trusted_proxies =
            CidrList::parse(&raw.trusted_proxies).map_err(|e| err("trusted_proxies", &e))?;
        let mut strip = Vec::with_capacity(raw.strip.len());
        for (i, name) in raw.strip.iter().enumerate() {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                err(
                    &format!("strip[{i}]"),
                    &format_args!("expected a valid HTTP header name, found {name:?}"),
                )
            })?;
            strip.push(header);
        }
        if raw.max_header_bytes < MIN_HEADER_BYTES {
            return Err(err(
                "max_header_bytes",
                &format_args!(
                    "expected at least {MIN_HEADER_BYTES} (hyper's smallest read buffer), found {}",
                    raw.max_header_bytes
                ),
            ));
        }
        if raw.upgraded_close_per_second == 0 {
            return Err(err("upgraded_close_per_second", &"expected at least 1"));
        }
        if raw.max_connections == 0 {
            return Err(err("max_connections", &"expected at least 1"));
        }
        if raw.max_cancelled_streams_percent > 100 {
            return Err(err(
                "max_cancelled_streams_percent",
                &format_args!(
                    "expected 0 to 100, found {}",
                    raw.max_cancelled_streams_percent
                ),
            ));
        }
        if !(raw.mirror_max_busy > 0.0 && raw.mirror_max_busy <= 1.0) {
            return Err(err(
                "mirror_max_busy",
                &format_args!(
                    "expected a share of the time above 0 and at most 1 (1: copies are never shed), found {}",
                    raw.mirror_max_busy
                ),
            ));
        }
        if raw.upstream_buffer_bytes < MIN_HEADER_BYTES {
            return Err(err(
                "upstream_buffer_bytes",
                &format_args!(
                    "expected at least {MIN_HEADER_BYTES} (hyper's smallest read buffer), found {}",
                    raw.upstream_buffer_bytes
                ),
            ));
        }
        for (field, value) in [
            ("upstream_max_connects", raw.upstream_max_connects),
            (
                "http2_max_concurrent_streams",
                raw.http2_max_concurrent_streams as usize,
            ),
            ("http2_max_send_buf_size", raw.http2_max_send_buf_size),
        ] {
            if value == 0 {
                return Err(err(field, &"expected at least 1"));
            }
        }
        for (field, value) in [
            ("http2_stream_window", raw.http2_stream_window),
            ("http2_connection_window", raw.http2_connection_window),
        ] {
            if !(65_535..=0x7fff_ffff).contains(&value) {
                return Err(err(
                    field,
                    &format_args!("expected 65535 to 2147483647 (HTTP/2's bounds), found {value}"),
                ));
            }
        }

        let (discovery, rules) = sources(&doc, &raw, &resolve)?;
        let tls = tls(&doc, &raw, &resolve)?;

        if raw.services.is_empty() {
            return Err(err(
                "services",
                &"expected at least one `[services.<name>]` table",
            ));
        }
        let mut services = Vec::with_capacity(raw.services.len());
        for (name, table) in raw.services {
            let field = |f: &str| format!("services.{name}.{f}");
            if name.is_empty() || name.contains('/') || name.chars().any(char::is_whitespace) {
                return Err(err(
                    &format!("services.{name}"),
                    &"a service name is one path segment",
                ));
            }
            let policy = Policy::try_from(table.policy).map_err(|e| err(&field(e.field()), &e))?;
            if policy.own_lane().is_some() {
                return Err(err(&field("own_lane"), &NO_OWN_LANE));
            }
            let retry = upstream::retry(&doc, &name, table.extra.retry.as_ref())?;
            let (probe, ejection) =
                upstream::health(&doc, &name, table.extra.health_check.as_ref())?;
            let transport = transport::transport(
                &doc,
                &name,
                table.extra.protocol,
                table.extra.tls.as_ref(),
                base,
            )?;
            if transport.tls.is_some()
                && matches!(
                    probe.check(),
                    gray_balance::health::Check::Http { .. }
                        | gray_balance::health::Check::Grpc { .. }
                )
            {
                return Err(err(
                    &field("health_check.kind"),
                    &"the HTTP and gRPC checks speak cleartext, and this service's instances \
                      speak TLS (its `tls` table): use `kind = \"connect\"`",
                ));
            }
            let rollout = match table.extra.rollout {
                Some(rollout) => {
                    rollout
                        .validate()
                        .map_err(|e| err(&field(&format!("rollout.{}", e.field())), &e))?;
                    Some(rollout)
                }
                None => None,
            };
            let mirror = mirror::mirror(&doc, &name, table.extra.mirror.as_ref())?;
            if rollout.as_ref().is_some_and(|r| r.shadow.is_some()) && mirror.is_none() {
                return Err(err(
                    &field("rollout.shadow"),
                    &"a shadow phase judges the copies of the service's mirror: add a                       `[services.<name>.mirror]` table (its `lane` the rule's)",
                ));
            }
            services.push(ServiceConfig {
                rollout,
                mirror,
                name,
                transport,
                strip_prefix: table.extra.strip_prefix.unwrap_or(true),
                policy,
                pick: table.extra.pick.unwrap_or_default(),
                retry,
                probe,
                ejection,
            });
        }
        Ok(Config {
            source: path.to_owned(),
            listen: raw.listen,
            tls,
            admin: raw.admin,
            admin_access: admin::access(
                &doc,
                admin::AdminKeys {
                    token: raw.admin_token.as_deref(),
                    token_file: raw.admin_token_file.clone(),
                    for_reads: raw.admin_token_for_reads,
                    admin_is_set: raw.admin.is_some(),
                },
                &resolve,
            )?,
            workers: raw.workers,
            trusted_clients,
            trusted_proxies,
            forwarded_header: raw.forwarded_header,
            carriers: raw.carriers.unwrap_or_else(default_carriers),
            strip,
            reject_prefix_escape: raw.reject_prefix_escape,
            rules,
            discovery,
            upstream_timeout: Duration::from_millis(raw.upstream_timeout_ms.max(1)),
            head_hold: Duration::from_millis(raw.head_hold_ms),
            limits: Limits {
                header_read_timeout: millis(raw.header_read_timeout_ms),
                max_header_bytes: raw.max_header_bytes,
                idle_timeout: millis(raw.idle_timeout_ms),
                max_connections: raw.max_connections,
                release_buffers_above: raw.release_buffers_above,
                request_body_timeout: millis(raw.request_body_timeout_ms),
                request_body_min_rate: raw.request_body_min_rate,
                send_timeout: millis(raw.send_timeout_ms),
                max_in_flight: raw.max_in_flight,
                max_in_flight_per_client: raw.max_in_flight_per_client,
                max_in_flight_per_instance: raw.max_in_flight_per_instance,
                max_cancelled_streams_percent: raw.max_cancelled_streams_percent,
                upstream_buffer_bytes: raw.upstream_buffer_bytes,
                upstream_max_connects: raw.upstream_max_connects,
                upstream_idle_timeout: Duration::from_millis(raw.upstream_idle_timeout_ms),
                upstream_max_idle: raw.upstream_max_idle,
                upstream_http2_keep_alive_interval: millis(
                    raw.upstream_http2_keep_alive_interval_ms,
                ),
                upstream_http2_keep_alive_timeout: Duration::from_millis(
                    raw.upstream_http2_keep_alive_timeout_ms.max(1),
                ),
                max_upgraded: raw.max_upgraded,
                upgraded_idle_timeout: millis(raw.upgraded_idle_timeout_ms),
                upgraded_close_per_second: raw.upgraded_close_per_second,
                http2_max_concurrent_streams: raw.http2_max_concurrent_streams,
                http2_max_send_buf_size: raw.http2_max_send_buf_size,
                http2_stream_window: raw.http2_stream_window,
                http2_connection_window: raw.http2_connection_window,
                http2_max_pending_accept_reset_streams: raw.http2_max_pending_accept_reset_streams,
                http2_max_local_error_reset_streams: raw.http2_max_local_error_reset_streams,
            },
            metrics_max_lanes: raw.metrics_max_lanes,
            seed003_headers: raw.seed003_headers,
            mirror_priority: raw.mirror_priority,
            mirror_max_busy: raw.mirror_max_busy,
            services,
            rollouts: rollout_settings(&doc, raw.rollouts.unwrap_or_default(), base, &resolve)?,
        })
    }
}

/// The `[rollouts]` table, checked.
fn rollout_settings(
    doc: &Document<'_>,
    raw: file::Rollouts,
    base: &Path,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> Result<RolloutSettings, ConfigError> {
    // a key given as 0 (or absent: its default), refused at its field
    let positive = |value: Option<u64>, default: u64, field: &str| match value.unwrap_or(default) {
        0 => Err(doc.error(field, "expected at least 1")),
        v => Ok(v),
    };
    let interval = positive(raw.interval_ms, 1000, "rollouts.interval_ms")?;
    let history = raw.history.unwrap_or(32);
    if history == 0 {
        return Err(doc.error("rollouts.history", "expected at least 1"));
    }
    let partition_hold = positive(raw.partition_hold_ms, 30_000, "rollouts.partition_hold_ms")?;
    let lease_ttl = raw.lease_ttl_ms.unwrap_or(5_000);
    if lease_ttl < 1_000 {
        return Err(doc.error(
            "rollouts.lease_ttl_ms",
            "expected at least 1000 (etcd's leases count whole seconds)",
        ));
    }
    let save_every = positive(raw.save_every_ms, 15_000, "rollouts.save_every_ms")?;
    let report_every = positive(raw.report_every_ms, 15_000, "rollouts.report_every_ms")?;
    Ok(RolloutSettings {
        state_dir: raw.state_dir.map_or_else(|| base.to_owned(), resolve),
        interval: Duration::from_millis(interval),
        history,
        partition_hold: Duration::from_millis(partition_hold),
        lease_ttl: Duration::from_millis(lease_ttl),
        save_every: Duration::from_millis(save_every),
        report_every: Duration::from_millis(report_every),
    })
}

impl Config {
    /// An error at `field` of the configuration file (read again to find the field's
    /// line): for checks that need more than the file, such as a rollout's rule, which
    /// must be a sticky-percentage rule of the rules.
    pub fn field_error(&self, field: &str, message: &dyn std::fmt::Display) -> ConfigError {
        let source = self.source.display().to_string();
        let text = std::fs::read_to_string(&self.source).unwrap_or_default();
        Document::new(&text, Format::Toml, &source).error(field, message)
    }

    /// Checks every service's rollout against `rules`: its rule must be a
    /// sticky-percentage rule there.
    pub fn check_rollouts(&self, rules: &gray_rules::RuleSet) -> Result<(), ConfigError> {
        for service in &self.services {
            if let Some(rollout) = &service.rollout
                && let Err(e) = rules.sticky_rule(&rollout.rule)
            {
                let field = format!("services.{}.rollout.rule", service.name);
                return Err(self.field_error(&field, &format_args!("{e}")));
            }
        }
        Ok(())
    }
}

/// The default carriers: `x-gray-lane` and `x-gray-info`, as [`gray_core::Carriers::default`]
/// reads and writes them.
#[must_use]
pub fn default_carriers() -> Vec<CarrierConfig> {
    vec![CarrierConfig::lane(), CarrierConfig::route()]
}

/// An error that lost its place on the way is placed again: serde buffers internally
/// tagged enums (`carriers`) and flattened tables (`[etcd]`), so an unknown key inside them
/// is reported at the enclosing table, without the key's line.
fn located(doc: &Document<'_>, e: ConfigError) -> ConfigError {
    let Some(field) = e.field() else {
        return e;
    };
    // gray-source's etcd settings name a field of their own: `field `user`: …`.
    if let Some((inner, rest)) = e
        .message()
        .strip_prefix("field `")
        .and_then(|m| m.split_once("`: "))
    {
        let placed = doc.error(&format!("{field}.{inner}"), rest);
        if placed.line().is_some() {
            return placed;
        }
    }
    let unknown = e
        .message()
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(key, _)| key);
    if let Some(key) = unknown.filter(|key| !field.ends_with(&format!(".{key}"))) {
        // The table as a value, to find where under `field` the key is.
        if let Ok(whole) = doc.parse::<serde_json::Value>()
            && let Some(path) = find_key(&whole, field, key)
        {
            return doc.error(&path, e.message());
        }
    }
    match e.line() {
        None => doc.error(field, e.message()),
        Some(_) => e,
    }
}

/// The dotted path of the first `key` found under `field` in `whole`, depth first.
fn find_key(whole: &serde_json::Value, field: &str, key: &str) -> Option<String> {
    fn walk(value: &serde_json::Value, path: String, key: &str) -> Option<String> {
        match value {
            serde_json::Value::Object(map) => {
                if map.contains_key(key) {
                    return Some(format!("{path}.{key}"));
                }
                map.iter()
                    .find_map(|(k, v)| walk(v, format!("{path}.{k}"), key))
            }
            serde_json::Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, v)| walk(v, format!("{path}[{i}]"), key)),
            _ => None,
        }
    }
    let mut value = whole;
    for part in field.split('.') {
        let (name, index) = match part.split_once('[') {
            Some((name, rest)) => (name, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        value = value.get(name)?;
        if let Some(i) = index {
            value = value.get(i)?;
        }
    }
    walk(value, field.to_owned(), key)
}

/// Refuses the table `table` of `doc`, at its line, when the binary was built without
/// gray-gateway's feature `feature` (`compiled` is `cfg!(feature = ..)`: a parameter, so that
/// a build with every feature tests the refusal too).
pub(super) fn needs_feature(
    doc: &Document<'_>,
    table: &str,
    feature: &str,
    compiled: bool,
) -> Result<(), ConfigError> {
    if compiled {
        return Ok(());
    }
    Err(doc.error(
        table,
        format_args!(
            "the `[{table}]` table needs gray-gateway's `{feature}` feature, which this binary \
             was built without (cargo build -p gray-gateway --features {feature})"
        ),
    ))
}

/// The `[tls]` table, and whether something listens at all.
fn tls(
    doc: &Document<'_>,
    raw: &file::File,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> Result<Option<TlsSettings>, ConfigError> {
    let Some(table) = &raw.tls else {
        if raw.listen.is_none() {
            return Err(doc.error(
                "listen",
                "missing field `listen`: the proxy needs `listen`, or a `[tls]` table with its own `listen`, or both",
            ));
        }
        return Ok(None);
    };
    needs_feature(doc, "tls", "tls", cfg!(feature = "tls"))?;
    // Port 0 picks a free port for each: the same address twice is fine then.
    if raw.listen == Some(table.listen) && table.listen.port() != 0 {
        return Err(doc.error(
            "tls.listen",
            format_args!(
                "{} is `listen` too: the plaintext and the TLS listeners need addresses of their own",
                table.listen
            ),
        ));
    }
    let client_certs = match (&table.client_ca_file, table.client_auth) {
        (Some(ca), auth) => Some(ClientCerts {
            ca_file: resolve(ca.clone()),
            required: !matches!(auth, Some(file::ClientAuth::Optional)),
        }),
        (None, Some(_)) => {
            return Err(doc.error(
                "tls.client_auth",
                "needs `client_ca_file`: the CA certificates client certificates are verified with",
            ));
        }
        (None, None) => None,
    };
    Ok(Some(TlsSettings {
        listen: table.listen,
        cert_file: resolve(table.cert_file.clone()),
        key_file: resolve(table.key_file.clone()),
        client_certs,
        min_version: table.min_version,
        handshake_timeout: millis(table.handshake_timeout_ms),
        reload_interval: millis(table.reload_interval_ms),
    }))
}

/// Where the instances and the rules come from.
fn sources(
    doc: &Document<'_>,
    raw: &file::File,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> Result<(Discovery, Rules), ConfigError> {
    let rules_file = raw.rules.clone().map(resolve);
    let instances = raw.instances.clone().map(resolve);
    if raw.etcd.is_some() {
        needs_feature(doc, "etcd", "etcd", cfg!(feature = "etcd"))?;
    }
    #[cfg(feature = "etcd")]
    if let Some(etcd) = &raw.etcd {
        if instances.is_some() {
            return Err(doc.error("etcd", "give either `instances` or `[etcd]`, not both"));
        }
        if etcd.client.tls().is_some() {
            needs_feature(doc, "etcd.tls", "etcd-tls", cfg!(feature = "etcd-tls"))?;
        }
        let settings = EtcdSettings {
            client: etcd.client.clone(),
            prefix: format!("{}/", etcd.prefix.trim_end_matches('/')),
        };
        let rules = match (rules_file, &etcd.rules_key) {
            (Some(_), Some(_)) => {
                return Err(doc.error(
                    "etcd.rules_key",
                    "give either `rules` or `etcd.rules_key`, not both",
                ));
            }
            (Some(file), None) => Rules::File(file),
            (None, Some(key)) => Rules::Etcd(Box::new(settings.clone()), key.clone()),
            (None, None) => Rules::None,
        };
        return Ok((Discovery::Etcd(Box::new(settings)), rules));
    }
    let _ = doc;
    let rules = rules_file.map_or(Rules::None, Rules::File);
    let discovery = instances.map_or(Discovery::Embedded, Discovery::File);
    Ok((discovery, rules))
}
