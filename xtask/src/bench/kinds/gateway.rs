//! The gray gateway (`GATEWAY_PACKAGE`'s binary `GATEWAY_BIN_NAME`), one worker, its
//! features on: a rules file evaluated for every request, then the trusted client's stain;
//! stripping, `X-Forwarded-For`, metrics, timeouts, admin. It picks round-robin within the
//! lane, as the others do. `gateway-tls` also terminates TLS (the `[tls]` table, with the
//! run's certificate).

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
{tls}
# Round-robin within the lane's instances: the algorithm of nginx's upstream blocks.
[services.svc]
fallback = "baseline"
pick = "round-robin"
"#;

/// The `[tls]` table of `gateway-tls`.
const TLS: &str = r#"
[tls]
listen = "{listen}"
cert_file = "{cert}"
key_file = "{key}"
"#;

/// The `gateway` and `gateway-tls` targets.
#[derive(Debug)]
pub(crate) struct Gateway {
    tls: bool,
}

impl Gateway {
    pub(crate) const PLAIN: Gateway = Gateway { tls: false };
    pub(crate) const TLS: Gateway = Gateway { tls: true };
}

impl Kind for Gateway {
    fn name(&self) -> &'static str {
        if self.tls { "gateway-tls" } else { "gateway" }
    }

    fn tls(&self) -> bool {
        self.tls
    }

    fn about(&self) -> &'static str {
        if self.tls {
            return "the gateway as `gateway`, also terminating TLS (a `[tls]` table with the\n\
                    run's certificate): wrk loads the TLS listener";
        }
        "the gray gateway (GATEWAY_PACKAGE's binary GATEWAY_BIN_NAME), one worker, its\n\
         features on (a rules file evaluated for every request, then the trusted\n\
         client's stain; stripping, X-Forwarded-For, metrics, timeouts, admin),\n\
         picking round-robin within the lane as the others do"
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
