//! The minimal hyper proxy (`bare-proxy` of `xtask/bench-support`): tokio's current-thread
//! runtime, `x-gray-lane: gray` to the gray upstreams, else baseline, round-robin within
//! the lane, hop-by-hop headers stripped, `/svc` stripped; nothing else. With hyper-util's
//! legacy pooled client (`bare`: the reference the gateway must stay within 1.05× of) or
//! gray-discovery's `HttpEndpoints` (`bare-gray`: separates what the client costs from what
//! the gateway's features cost).

use std::ffi::OsString;

use super::{Kind, Launch, Program, Setup};
use crate::bench::{Result, settings::Settings};

/// The `bare` and `bare-gray` targets: the same proxy with another client.
#[derive(Debug)]
pub(crate) struct Bare {
    name: &'static str,
    /// `bare-proxy --client`.
    client: &'static str,
    about: &'static str,
}

impl Bare {
    pub(crate) const LEGACY: Bare = Bare {
        name: "bare",
        client: "legacy",
        about: "the minimal hyper proxy (`bare-proxy` of bench-support): current-thread\n\
                runtime, hyper-util's legacy pooled client, `x-gray-lane: gray` → the gray\n\
                upstreams, else baseline, round-robin within the lane, hop-by-hop headers\n\
                stripped, /svc stripped; nothing else. The reference the gateway must stay\n\
                within 1.05× of",
    };

    pub(crate) const GRAY: Bare = Bare {
        name: "bare-gray",
        client: "gray",
        about: "the same minimal proxy sending with gray-discovery's `HttpEndpoints` (the\n\
                gateway's connections) instead of hyper-util's client: separates what the\n\
                client costs from what the gateway's features cost",
    };
}

impl Kind for Bare {
    fn name(&self) -> &'static str {
        self.name
    }

    fn about(&self) -> &'static str {
        self.about
    }

    fn program(&self, _: &Settings) -> Program {
        Program::Cargo {
            package: "bench-support".into(),
            bin: "bare-proxy".into(),
            prebuilt: None,
        }
    }

    fn configure(&self, setup: &Setup<'_>) -> Result<Launch> {
        let mut args: Vec<OsString> = vec![
            "--listen".into(),
            setup.listen.to_string().into(),
            "--client".into(),
            self.client.into(),
        ];
        for (flag, lane) in [
            ("--baseline", &setup.upstreams.baseline),
            ("--gray", &setup.upstreams.gray),
        ] {
            for instance in lane {
                args.push(flag.into());
                args.push(instance.addr.to_string().into());
            }
        }
        Ok(Launch {
            args,
            env: Vec::new(),
            describe: format!("minimal proxy, {} client", self.client),
        })
    }
}
