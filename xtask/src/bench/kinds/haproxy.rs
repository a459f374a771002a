//! HAProxy, `nbthread 1`: an `acl` on `x-gray-lane` chooses a backend per lane,
//! `balance roundrobin`, `http-reuse always`, `/svc` stripped by `replace-path`.

use super::{Kind, Launch, Program, Setup, check, render, write};
use crate::bench::{Result, settings::Settings};

/// HAProxy's configuration: one thread, a backend per lane chosen by an acl on the header,
/// round-robin, idle upstream connections reused by any client connection.
const TEMPLATE: &str = r#"global
    nbthread 1
    maxconn 4096

defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s

frontend gray
    bind {listen}
    acl lane_gray req.hdr(x-gray-lane) -i gray
    # The path only: the query string is kept as it came.
    http-request replace-path ^/svc(/.*)$ \1
    use_backend gray if lane_gray
    default_backend baseline

backend baseline
    balance roundrobin
    server base-1 {base1}
    server base-2 {base2}

backend gray
    balance roundrobin
    server gray-1 {gray1}
    server gray-2 {gray2}
"#;

/// The `haproxy` target.
#[derive(Debug)]
pub(crate) struct Haproxy;

impl Kind for Haproxy {
    fn name(&self) -> &'static str {
        "haproxy"
    }

    fn about(&self) -> &'static str {
        "HAProxy, `nbthread 1`, an `acl` on `x-gray-lane` choosing a backend per lane,\n\
         `balance roundrobin`, `http-reuse always`, /svc stripped by `replace-path`"
    }

    fn program(&self, _: &Settings) -> Program {
        Program::System {
            command: "haproxy",
            package: "haproxy",
        }
    }

    fn configure(&self, setup: &Setup<'_>) -> Result<Launch> {
        let mut values = vec![("listen", setup.listen.to_string())];
        values.extend(setup.upstreams.values());
        let config = setup.dir.join("haproxy.cfg");
        write(&config, &render(TEMPLATE, &values)?)?;
        check(
            setup.program,
            &["-c".into(), "-q".into(), "-f".into(), config.clone().into()],
            &config,
        )?;
        Ok(Launch {
            args: vec!["-db".into(), "-f".into(), config.into()],
            env: Vec::new(),
            describe: "nbthread 1".into(),
        })
    }
}
