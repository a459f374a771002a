//! The gray gateway (`GATEWAY_PACKAGE`'s binary `GATEWAY_BIN_NAME`), one worker, its
//! features on: a rules file evaluated for every request, then the trusted client's stain;
//! stripping, `X-Forwarded-For`, metrics, timeouts, admin. It picks round-robin within the
//! lane, as the others do. `gateway-tls` also terminates TLS (the `[tls]` table, with the
//! run's certificate); `gateway-h2c` speaks HTTP/2 to the upstreams (the upstream binary
//! answers both).

use super::{Kind, Launch, Program, Setup, render, write};
use crate::bench::{Result, settings::Settings};

const INSTANCES: &str = r#"[[services.svc]]
id = "base-1"
address = "{base1}"

[[services.svc]]
id = "base-2"
address = "{base2}"

[[services.svc]]
id = "gray-1"
address = "{gray1}"
labels = { gray = "true" }

[[services.svc]]
id = "gray-2"
address = "{gray2}"
labels = { gray = "true" }
"#;

const RULES: &str = r#"[[rules]]
name = "testers"
when = { header = { name = "x-tester", present = true } }
lane = "gray"
"#;

const GATEWAY: &str = r#"listen = "{listen}"
admin = "{admin}"
trusted_clients = ["127.0.0.1/32"]
instances = "{instances}"
# Evaluated for every request (rules decide first); none matches wrk's requests, so the
# stain of a trusted client (wrk, 127.0.0.1) decides, as nginx's and HAProxy's routing do.
rules = "{rules}"
workers = 1
{extra}
{tls}
# Round-robin within the lane's instances: the algorithm of nginx's upstream blocks.
[services.svc]
fallback = "baseline"
pick = "round-robin"
{protocol}
"#;

/// The `[tls]` table of `gateway-tls`.
const TLS: &str = r#"
[tls]
listen = "{listen}"
cert_file = "{cert}"
key_file = "{key}"
"#;

/// The `gateway`, `gateway-tls` and `gateway-h2c` targets.
#[derive(Debug)]
pub(crate) struct Gateway {
    name: &'static str,
    tls: bool,
    /// The services' `protocol`.
    protocol: &'static str,
    about: &'static str,
}

impl Gateway {
    pub(crate) const PLAIN: Gateway = Gateway {
        name: "gateway",
        tls: false,
        protocol: "http1",
        about: "the gray gateway (GATEWAY_PACKAGE's binary GATEWAY_BIN_NAME), one worker, its\n\
                features on (a rules file evaluated for every request, then the trusted\n\
                client's stain; stripping, X-Forwarded-For, metrics, timeouts, admin),\n\
                picking round-robin within the lane as the others do; HTTP/1.1 keep-alive\n\
                connections to the upstreams",
    };
    pub(crate) const TLS: Gateway = Gateway {
        name: "gateway-tls",
        tls: true,
        protocol: "http1",
        about: "the gateway as `gateway`, also terminating TLS (a `[tls]` table with the\n\
                run's certificate): wrk loads the TLS listener",
    };
    pub(crate) const H2C: Gateway = Gateway {
        name: "gateway-h2c",
        tls: false,
        protocol: "h2c",
        about: "the gateway as `gateway`, speaking HTTP/2 in cleartext to the upstreams\n\
                (`protocol = \"h2c\"`: one multiplexed connection per upstream, driven by a\n\
                task of its own)",
    };
}

impl Kind for Gateway {
    fn name(&self) -> &'static str {
        self.name
    }

    fn tls(&self) -> bool {
        self.tls
    }

    fn about(&self) -> &'static str {
        self.about
    }

    fn program(&self, settings: &Settings) -> Program {
        Program::Cargo {
            package: settings.gateway_package.clone(),
            bin: settings.gateway_bin_name.clone(),
            prebuilt: settings.gateway_bin.clone(),
        }
    }

    fn configure(&self, setup: &Setup<'_>) -> Result<Launch> {
        let instances = setup.dir.join("instances.toml");
        let rules = setup.dir.join("rules.toml");
        let config = setup.dir.join("gateway.toml");
        write(&instances, &render(INSTANCES, &setup.upstreams.values())?)?;
        write(&rules, RULES)?;
        let values = [
            ("listen", setup.listen.to_string()),
            ("admin", setup.admin.to_string()),
            ("instances", instances.display().to_string()),
            ("rules", rules.display().to_string()),
            ("extra", setup.settings.gateway_config.clone()),
            // Only when not the default: a gateway built before the key existed (a
            // `gateway#LABEL` target) still reads the configuration.
            (
                "protocol",
                match self.protocol {
                    "http1" => String::new(),
                    other => format!("protocol = \"{other}\""),
                },
            ),
            (
                "tls",
                match setup.tls {
                    Some(tls) => render(
                        TLS,
                        &[
                            ("listen", tls.listen.to_string()),
                            ("cert", tls.cert.display().to_string()),
                            ("key", tls.key.display().to_string()),
                        ],
                    )?,
                    None => String::new(),
                },
            ),
        ];
        write(&config, &render(GATEWAY, &values)?)?;
        let log = setup.settings.gateway_log.clone();
        Ok(Launch {
            args: vec!["--config".into(), config.into()],
            describe: format!("admin {}, RUST_LOG={log}", setup.admin),
            env: vec![("RUST_LOG", log)],
        })
    }
}
