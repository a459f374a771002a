//! `forwarded_header` through the real gateway: which forwarding header of a trusted proxy
//! the IP rules read. With `forwarded_header = "forwarded"`, an RFC 7239 `Forwarded: for=…`
//! written by a trusted proxy decides the client IP, and `X-Forwarded-For` is ignored; with
//! the default (`x-forwarded-for`), a `Forwarded` header is ignored. The client is reqwest,
//! bound to the trusted proxy's (or an untrusted peer's) own loopback address.

use std::net::{IpAddr, Ipv4Addr};

use axum::{Router, routing::any};
use gray_gateway::Gateway;
use gray_test_support::{TempDir, WAIT};
use gray_tests::{Server, serve};

/// The trusted proxy in front of the gateway.
const PROXY: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// A peer nobody trusts.
const UNTRUSTED: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 4));

/// A gateway whose only rule puts the office network (seed 003) in the gray lane, in front
/// of a baseline and a gray instance that answer with their id.
struct Setup {
    gateway: Gateway,
    _dir: TempDir,
    _upstreams: [Server; 2],
}

async fn setup(forwarded_header: Option<&str>) -> Setup {
    // Each answers with its id, whatever the request.
    let instance = |id: &'static str| serve(Router::new().fallback(any(id)));
    let (base, gray) = (instance("svc-base").await, instance("svc-gray").await);
    let dir = TempDir::new("gateway-forwarded");
    std::fs::write(
        dir.path().join("instances.toml"),
        format!(
            "[[services.svc]]\nid = \"svc-base\"\naddress = \"{}\"\n\n\
             [[services.svc]]\nid = \"svc-gray\"\naddress = \"{}\"\nlabels = {{ gray = \"true\" }}\n",
            base.addr(),
            gray.addr()
        ),
    )
    .expect("write the instances");
    std::fs::write(
        dir.path().join("rules.toml"),
        "[[rules]]\nname = \"office network\"\nwhen = { ip = [\"10.9.0.0/16\"] }\nlane = \"gray\"\n",
    )
    .expect("write the rules");
    let setting =
        forwarded_header.map_or(String::new(), |h| format!("forwarded_header = \"{h}\"\n"));
    std::fs::write(
        dir.path().join("gateway.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\ntrusted_proxies = [\"127.0.0.2/32\"]\n{setting}\
             rules = \"rules.toml\"\ninstances = \"instances.toml\"\n\n[services.svc]\n"
        ),
    )
    .expect("write the configuration");
    let gateway = gray_tests::start_gateway(dir.path()).await;
    Setup {
        gateway,
        _dir: dir,
        _upstreams: [base, gray],
    }
}

/// Sends `GET /svc/a` from `from` with `headers`; the id of the instance that answered.
async fn served_by(setup: &Setup, from: IpAddr, headers: &[(&str, &str)]) -> String {
    let client = reqwest::Client::builder()
        .no_proxy()
        .local_address(from)
        .timeout(WAIT)
        .build()
        .expect("a reqwest client");
    let mut req = client.get(format!("http://{}/svc/a", setup.gateway.addr()));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let res = req.send().await.expect("the gateway answers");
    assert_eq!(res.status(), 200, "{headers:?}");
    res.text().await.expect("a body")
}

#[tokio::test]
async fn forwarded_is_read_when_configured() {
    let setup = setup(Some("forwarded")).await;
    let cases: &[(&str, IpAddr, &[(&str, &str)], &str)] = &[
        (
            "the proxy's Forwarded names an office client",
            PROXY,
            &[("forwarded", "for=10.9.1.1")],
            "svc-gray",
        ),
        (
            "quoted, with a port and other parameters; the proxy appended on the right",
            PROXY,
            &[(
                "forwarded",
                r#"for=203.0.113.9, for="10.9.1.1:4711";proto=https;by=_gw"#,
            )],
            "svc-gray",
        ),
        (
            "the client forged an office address on the left; the proxy appended the real one",
            PROXY,
            &[("forwarded", "for=10.9.1.1, for=203.0.113.9")],
            "svc-base",
        ),
        (
            "the proxy's Forwarded names a client outside the office",
            PROXY,
            &[("forwarded", "for=203.0.113.9")],
            "svc-base",
        ),
        (
            "X-Forwarded-For is not the configured header",
            PROXY,
            &[("x-forwarded-for", "10.9.1.1")],
            "svc-base",
        ),
        (
            "an untrusted peer's Forwarded is ignored",
            UNTRUSTED,
            &[("forwarded", "for=10.9.1.1")],
            "svc-base",
        ),
    ];
    for (what, from, headers, instance) in cases {
        assert_eq!(served_by(&setup, *from, headers).await, *instance, "{what}");
    }
}

#[tokio::test]
async fn forwarded_is_ignored_with_x_forwarded_for() {
    for setting in [None, Some("x-forwarded-for")] {
        let setup = setup(setting).await;
        let cases: &[(&str, &[(&str, &str)], &str)] = &[
            (
                "a trusted proxy's Forwarded is not the configured header",
                &[("forwarded", "for=10.9.1.1")],
                "svc-base",
            ),
            (
                "control: its X-Forwarded-For is read",
                &[("x-forwarded-for", "10.9.1.1")],
                "svc-gray",
            ),
            (
                "both: X-Forwarded-For decides",
                &[
                    ("forwarded", "for=10.9.1.1"),
                    ("x-forwarded-for", "203.0.113.9"),
                ],
                "svc-base",
            ),
        ];
        for (what, headers, instance) in cases {
            let served = served_by(&setup, PROXY, headers).await;
            assert_eq!(served, *instance, "{setting:?}: {what}");
        }
    }
}
