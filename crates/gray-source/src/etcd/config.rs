//! How to reach an etcd cluster: [`EtcdConfig`], and the connections made with it.

use std::{fmt, future::Future, path::PathBuf, time::Duration};

use etcd_client::{Client, ConnectOptions};
use gray_core::backoff::Backoff;
use serde::Deserialize;

use super::EtcdTls;
use crate::SourceError;

/// How to reach an etcd cluster: endpoints and client options, shared by every
/// [`EtcdSource`](super::EtcdSource) and by self-registration.
///
/// Built in code with [`EtcdConfig::new`] and `with_*` setters, or read from a
/// configuration file: it implements [`serde::Deserialize`] from a table whose fields are
/// the setters' (durations in milliseconds, unknown fields rejected):
///
/// ```toml
/// endpoints = ["https://10.0.0.1:2379", "https://10.0.0.2:2379", "https://10.0.0.3:2379"]
/// connect_timeout_ms = 5000      # connecting to one member (TCP and TLS)
/// request_timeout_ms = 5000      # any one request: a listing, a watch creation, a login
/// keep_alive_interval_ms = 10000 # HTTP/2 pings while a watch or lease stream is open; 0: off
/// keep_alive_timeout_ms = 5000   # a ping unanswered this long drops the connection
/// progress_deadline_ms = 5000    # a watch silent this long moves to another member; 0: off
/// backoff_min_ms = 100           # between failed attempts: from this, doubling ...
/// backoff_max_ms = 5000          # ... up to this, with jitter
/// user = "gray"                  # with `password`: etcd authentication
/// password = "secret"
///
/// [tls]                          # TLS (feature `etcd-tls`); endpoints may then be https://
/// ca_file = "/etc/gray/etcd-ca.pem"
/// cert_file = "/etc/gray/etcd-client.pem"      # client certificate, with key_file
/// key_file = "/etc/gray/etcd-client-key.pem"
/// server_name = "etcd.internal"                # when the certificate names a host, not the IP
/// ```
///
/// Only `endpoints` is required; the others default to the values shown (keep-alive and
/// progress deadline on; no authentication, no TLS). A program whose `[etcd]` table has
/// fields of its own flattens this one into it, and still rejects unknown fields:
/// `#[serde(deny_unknown_fields)] struct Table { prefix: String, #[serde(flatten)] etcd:
/// EtcdConfig }`.
///
/// ```
/// use std::time::Duration;
/// use gray_source::etcd::EtcdConfig;
///
/// let config: EtcdConfig = toml::from_str(r#"
///     endpoints = ["http://127.0.0.1:2379"]
///     progress_deadline_ms = 3000
///     user = "gray"
///     password = "secret"
/// "#)?;
/// assert_eq!(config.progress_deadline(), Some(Duration::from_secs(3)));
/// assert_eq!(config.user(), Some("gray"));
/// assert!(!format!("{config:?}").contains("secret"));
///
/// let wrong = toml::from_str::<EtcdConfig>(r#"endpoints = ["x"]
/// timeout_ms = 1"#);
/// assert!(wrong.unwrap_err().to_string().contains("unknown field `timeout_ms`"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Deserialize)]
#[serde(try_from = "Settings")]
#[non_exhaustive]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    keep_alive: Option<(Duration, Duration)>,
    progress_deadline: Option<Duration>,
    backoff: Backoff,
    user: Option<(String, String)>,
    tls: Option<EtcdTls>,
}

// === impl EtcdConfig ===

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("keep_alive", &self.keep_alive)
            .field("progress_deadline", &self.progress_deadline)
            .field("backoff", &self.backoff)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .field("tls", &self.tls)
            .finish()
    }
}

/// The default time allowed to connect and per request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default HTTP/2 keep-alive interval and timeout: a ping after 10 s without a frame
/// from the member, answered within 5 s.
///
/// etcd refuses pings closer than its `--grpc-keepalive-min-time` (5 s by default) and any
/// ping on a connection without an open stream: it answers both with `GOAWAY
/// ENHANCE_YOUR_CALM` (`too_many_pings`) after a few. So pings are sent only while a stream
/// (a watch, a lease keep-alive) is open, at twice etcd's minimum. They are the second
/// guard against a frozen member: the [progress deadline](DEFAULT_PROGRESS_DEADLINE) is the
/// first, and the one that sets the bound (a watch leaves a silent member within 5 s).
pub const DEFAULT_KEEP_ALIVE: (Duration, Duration) =
    (Duration::from_secs(10), Duration::from_secs(5));

/// The default progress deadline: a watch that hears nothing from its member for this
/// long (no event, no answer to a progress request) moves to another member.
pub const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(5);

impl EtcdConfig {
    /// The cluster at `endpoints` (`http://127.0.0.1:2379`, `https://…` with TLS, or
    /// `127.0.0.1:2379`), with the defaults: 5 s to connect and per request, HTTP/2
    /// keep-alive after 10 s of silence with a 5 s timeout ([`DEFAULT_KEEP_ALIVE`]), a 5 s
    /// progress deadline, reconnecting after 100 ms doubling to 5 s, no authentication, no
    /// TLS.
    pub fn new<E: AsRef<str>>(endpoints: impl IntoIterator<Item = E>) -> Self {
        EtcdConfig {
            endpoints: endpoints
                .into_iter()
                .map(|e| e.as_ref().to_owned())
                .collect(),
            connect_timeout: DEFAULT_TIMEOUT,
            request_timeout: DEFAULT_TIMEOUT,
            keep_alive: Some(DEFAULT_KEEP_ALIVE),
            progress_deadline: Some(DEFAULT_PROGRESS_DEADLINE),
            backoff: Backoff::default(),
            user: None,
            tls: None,
        }
    }

    /// How long connecting to one member may take (at least 1 ms).
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long one request (a listing, a watch creation, a login) may take before it is
    /// abandoned and retried (at least 1 ms).
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// HTTP/2 keep-alive: a ping after `interval` without a frame from the member, the
    /// connection dropped when one is not answered within `timeout`; `None` turns them off.
    /// Pings are sent only while a stream (a watch, a lease keep-alive) is open: etcd
    /// answers pings on a connection without one, or closer than its
    /// `--grpc-keepalive-min-time` (5 s by default), with `too_many_pings` and closes the
    /// connection. Keep `interval` above that minimum (see [`DEFAULT_KEEP_ALIVE`]).
    #[must_use]
    pub fn with_keep_alive(mut self, keep_alive: Option<(Duration, Duration)>) -> Self {
        self.keep_alive = keep_alive.map(|(interval, timeout)| {
            (
                interval.max(Duration::from_millis(1)),
                timeout.max(Duration::from_millis(1)),
            )
        });
        self
    }

    /// How long a watch may hear nothing from its member before it gives up on it and
    /// reconnects, to the next endpoint: while idle, the watch asks for a progress
    /// notification every third of `deadline`, so a member that answers never reaches it.
    /// `None` turns the deadline off (HTTP/2 keep-alive is then the only guard against a
    /// frozen member). At least 3 ms.
    #[must_use]
    pub fn with_progress_deadline(mut self, deadline: Option<Duration>) -> Self {
        self.progress_deadline = deadline.map(|d| d.max(Duration::from_millis(3)));
        self
    }

    /// Waits `backoff` between failed attempts (never after a success).
    #[must_use]
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Logs in as `user` with `password` (etcd authentication); the token is renewed when
    /// it expires.
    #[must_use]
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// Connects with TLS (needs the feature `etcd-tls`; without it, connecting fails with
    /// a [`SourceError::Config`] naming the feature).
    #[must_use]
    pub fn with_tls(mut self, tls: EtcdTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The endpoints.
    #[must_use]
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The time allowed to connect to one member.
    #[must_use]
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The time allowed per request.
    #[must_use]
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The HTTP/2 keep-alive interval and timeout, if on.
    #[must_use]
    pub fn keep_alive(&self) -> Option<(Duration, Duration)> {
        self.keep_alive
    }

    /// The progress deadline, if on.
    #[must_use]
    pub fn progress_deadline(&self) -> Option<Duration> {
        self.progress_deadline
    }

    /// The reconnection backoff.
    #[must_use]
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// The user name, with authentication.
    #[must_use]
    pub fn user(&self) -> Option<&str> {
        self.user.as_ref().map(|(user, _)| user.as_str())
    }

    /// The TLS settings, if any.
    #[must_use]
    pub fn tls(&self) -> Option<&EtcdTls> {
        self.tls.as_ref()
    }

    /// Connects a client of every endpoint (etcd-client balances requests among them) with
    /// these options. The client logs in first when a user is set, so wrong credentials
    /// fail here. Bounded by the connect and request timeouts.
    ///
    /// The watches of [`EtcdSource`](super::EtcdSource) do not use it: they talk to one
    /// member at a time and move to the next one when it fails or falls silent.
    pub async fn connect(&self) -> Result<Client, SourceError> {
        if self.endpoints.is_empty() {
            return Err(no_endpoints());
        }
        self.connect_to(&self.endpoints).await
    }

    /// Connects a client of `endpoints` (a subset of this config's).
    pub(crate) async fn connect_to(&self, endpoints: &[String]) -> Result<Client, SourceError> {
        let options = self.connect_options().await?;
        let action = || {
            self.action(if endpoints.len() == 1 {
                format!("connect to {}", endpoints[0])
            } else {
                format!("connect to {endpoints:?}")
            })
        };
        // Connecting is lazy except for the login, which is a request.
        let bound = self.connect_timeout + self.request_timeout;
        match tokio::time::timeout(bound, Client::connect(endpoints, Some(options))).await {
            Ok(Ok(client)) => Ok(client),
            // The login, when a user is set, is the first request on the connection.
            Ok(Err(source)) => Err(SourceError::Etcd {
                action: action(),
                source,
            }
            .first_on_plain_text()),
            Err(_) => Err(SourceError::Timeout {
                action: action(),
                after: bound,
            }),
        }
    }

    async fn connect_options(&self) -> Result<ConnectOptions, SourceError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_timeout(self.request_timeout);
        if let Some((interval, timeout)) = self.keep_alive {
            // Never on a connection without a stream: etcd counts such pings as abuse.
            options = options
                .with_keep_alive(interval, timeout)
                .with_keep_alive_while_idle(false);
        }
        if let Some((user, password)) = &self.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if let Some(tls) = &self.tls {
            options = tls.apply(options).await?;
        }
        Ok(options)
    }

    /// Runs one request with the request timeout.
    pub(crate) async fn timed<T>(
        &self,
        action: impl FnOnce() -> String,
        fut: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, SourceError> {
        match tokio::time::timeout(self.request_timeout, fut).await {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(source)) => Err(SourceError::Etcd {
                action: self.action(action()),
                source,
            }),
            Err(_) => Err(SourceError::Timeout {
                action: self.action(action()),
                after: self.request_timeout,
            }),
        }
    }

    /// What a request does, saying when it goes over TLS (a member that refuses a client
    /// certificate just closes the connection: the error alone cannot tell).
    fn action(&self, action: String) -> String {
        if self.tls.is_some() {
            action + " " + OVER_TLS
        } else {
            action
        }
    }
}

/// How an action over TLS ends.
pub(crate) const OVER_TLS: &str = "over TLS";

fn no_endpoints() -> SourceError {
    SourceError::Config {
        field: "endpoints",
        message: "expected at least one etcd endpoint".into(),
    }
}

// === impl Deserialize ===

/// The configuration-file form of [`EtcdConfig`]: every option, plain.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    endpoints: Vec<String>,
    connect_timeout_ms: Option<u64>,
    request_timeout_ms: Option<u64>,
    keep_alive_interval_ms: Option<u64>,
    keep_alive_timeout_ms: Option<u64>,
    progress_deadline_ms: Option<u64>,
    backoff_min_ms: Option<u64>,
    backoff_max_ms: Option<u64>,
    user: Option<String>,
    password: Option<String>,
    tls: Option<TlsSettings>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsSettings {
    ca_file: PathBuf,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    server_name: Option<String>,
}

fn ms(value: u64) -> Duration {
    Duration::from_millis(value)
}

impl TryFrom<Settings> for EtcdConfig {
    type Error = String;

    fn try_from(s: Settings) -> Result<Self, String> {
        if s.endpoints.is_empty() {
            return Err("field `endpoints`: expected at least one etcd endpoint".into());
        }
        let mut config = EtcdConfig::new(&s.endpoints);
        if let Some(t) = s.connect_timeout_ms {
            config = config.with_connect_timeout(ms(t));
        }
        if let Some(t) = s.request_timeout_ms {
            config = config.with_request_timeout(ms(t));
        }
        let (interval, timeout) = DEFAULT_KEEP_ALIVE;
        config = config.with_keep_alive(match s.keep_alive_interval_ms {
            Some(0) => None,
            interval_ms => Some((
                interval_ms.map_or(interval, ms),
                s.keep_alive_timeout_ms.map_or(timeout, ms),
            )),
        });
        config = config.with_progress_deadline(match s.progress_deadline_ms {
            Some(0) => None,
            deadline => Some(deadline.map_or(DEFAULT_PROGRESS_DEADLINE, ms)),
        });
        let default = Backoff::default();
        let (min, max) = (
            s.backoff_min_ms.map_or(default.min(), ms),
            s.backoff_max_ms.map_or(default.max(), ms),
        );
        if min > max {
            return Err(format!(
                "field `backoff_min_ms`: {} ms is more than `backoff_max_ms` ({} ms)",
                min.as_millis(),
                max.as_millis()
            ));
        }
        config = config.with_backoff(Backoff::new(min, max));
        match (s.user, s.password) {
            (Some(user), Some(password)) => config = config.with_user(user, password),
            (None, None) => {}
            (Some(_), None) => return Err("field `user`: given without `password`".into()),
            (None, Some(_)) => return Err("field `password`: given without `user`".into()),
        }
        if let Some(t) = s.tls {
            let mut tls = EtcdTls::ca_file(t.ca_file);
            match (t.cert_file, t.key_file) {
                (Some(cert), Some(key)) => tls = tls.with_identity_files(cert, key),
                (None, None) => {}
                (Some(_), None) => {
                    return Err("field `tls.cert_file`: given without `tls.key_file`".into());
                }
                (None, Some(_)) => {
                    return Err("field `tls.key_file`: given without `tls.cert_file`".into());
                }
            }
            if let Some(name) = t.server_name {
                tls = tls.with_server_name(name);
            }
            config = config.with_tls(tls);
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<EtcdConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn every_option_maps_onto_the_builder() {
        let config = parse(
            r#"
            endpoints = ["https://a:2379", "https://b:2379"]
            connect_timeout_ms = 1000
            request_timeout_ms = 2000
            keep_alive_interval_ms = 3000
            keep_alive_timeout_ms = 4000
            progress_deadline_ms = 6000
            backoff_min_ms = 7
            backoff_max_ms = 8000
            user = "gray"
            password = "secret"
            [tls]
            ca_file = "ca.pem"
            cert_file = "client.pem"
            key_file = "client-key.pem"
            server_name = "etcd.internal"
            "#,
        )
        .unwrap();
        assert_eq!(config.endpoints(), ["https://a:2379", "https://b:2379"]);
        assert_eq!(config.connect_timeout(), ms(1000));
        assert_eq!(config.request_timeout(), ms(2000));
        assert_eq!(config.keep_alive(), Some((ms(3000), ms(4000))));
        assert_eq!(config.progress_deadline(), Some(ms(6000)));
        assert_eq!(config.backoff().min(), ms(7));
        assert_eq!(config.backoff().max(), ms(8000));
        assert_eq!(config.user(), Some("gray"));
        let debug = format!("{config:?}");
        assert!(!debug.contains("secret"), "{debug}");
        assert!(debug.contains("client-key.pem"), "{debug}");
        assert!(debug.contains("etcd.internal"), "{debug}");
    }

    #[test]
    fn defaults_and_switches() {
        let config = parse(r#"endpoints = ["127.0.0.1:2379"]"#).unwrap();
        let built = EtcdConfig::new(["127.0.0.1:2379"]);
        assert_eq!(format!("{config:?}"), format!("{built:?}"));
        assert_eq!(config.keep_alive(), Some(DEFAULT_KEEP_ALIVE));
        assert_eq!(config.progress_deadline(), Some(DEFAULT_PROGRESS_DEADLINE));

        let off = parse(
            r#"endpoints = ["x:1"]
            keep_alive_interval_ms = 0
            progress_deadline_ms = 0"#,
        )
        .unwrap();
        assert_eq!(off.keep_alive(), None);
        assert_eq!(off.progress_deadline(), None);
    }

    /// How a program's `[etcd]` table with settings of its own (a key prefix) maps onto it.
    #[test]
    fn a_wider_table_flattens_onto_it() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Table {
            prefix: String,
            #[serde(flatten)]
            client: EtcdConfig,
        }
        let table: Table = toml::from_str(
            r#"prefix = "/gray"
            endpoints = ["x:1"]
            user = "gray"
            password = "p""#,
        )
        .unwrap();
        assert_eq!(table.prefix, "/gray");
        assert_eq!(table.client.user(), Some("gray"));
        let err = toml::from_str::<Table>(
            r#"prefix = "/gray"
            endpoints = ["x:1"]
            usr = "gray""#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("unknown field `usr`"), "{err}");
        let err = toml::from_str::<Table>(
            r#"prefix = "/gray"
            endpoints = ["x:1"]
            user = "gray""#,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("given without `password`"),
            "{err}"
        );
    }

    #[test]
    fn wrong_settings_name_their_field() {
        for (text, expected) in [
            (
                r#"endpoints = []"#,
                "field `endpoints`: expected at least one",
            ),
            (
                r#"endpoints = ["x:1"]
                user = "gray""#,
                "field `user`: given without `password`",
            ),
            (
                r#"endpoints = ["x:1"]
                backoff_min_ms = 10
                backoff_max_ms = 5"#,
                "field `backoff_min_ms`: 10 ms is more than `backoff_max_ms` (5 ms)",
            ),
            (
                r#"endpoints = ["x:1"]
                [tls]
                ca_file = "ca.pem"
                key_file = "k.pem""#,
                "field `tls.key_file`: given without `tls.cert_file`",
            ),
            (
                r#"endpoints = ["x:1"]
                [tls]
                ca = "ca.pem""#,
                "unknown field `ca`",
            ),
            (
                r#"endpoints = ["x:1"]
            request_timeout = 5"#,
                "unknown field `request_timeout`",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }
}
