//! TLS to a real etcd member that requires client certificates (`--client-cert-auth`),
//! with certificates the test makes: the right ones work, wrong ones give a clear error
//! from `load()` at once and a WARN and a status error in a watch.

mod support;

use gray_source::{
    Source, SourceError, Update,
    etcd::{EtcdConfig, EtcdSource, EtcdTls},
};
use gray_test_support::{
    WAIT,
    etcd::{Etcd, Tls},
};
use support::{Follow, describe};

fn config(etcd: &Etcd, tls: EtcdTls) -> EtcdConfig {
    support::fast([etcd.endpoint()]).with_tls(tls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_from_files_or_memory() {
    let etcd = Etcd::start_tls().await;
    assert!(etcd.endpoint().starts_with("https://"));
    let tls = etcd.tls().expect("a TLS member");
    etcd.put("/gray/rules", "v1").await;

    let from_files = EtcdTls::ca_file(tls.ca_file())
        .with_identity_files(tls.client_cert_file(), tls.client_key_file());
    let source = EtcdSource::key(config(&etcd, from_files), "/gray/rules");
    assert_eq!(
        source.load().await.expect("load over TLS").entries[0].value,
        b"v1"
    );
    let mut follow = Follow::start(&source);
    assert!(matches!(follow.next().await, Update::Reset(_)));
    etcd.put("/gray/rules", "v2").await;
    assert_eq!(describe(&follow.next().await), "put /gray/rules");
    assert_eq!(follow.held["/gray/rules"], b"v2");

    let in_memory = EtcdTls::ca_pem(tls.ca_pem())
        .with_identity_pem(tls.client_cert_pem(), tls.client_key_pem())
        .with_server_name("localhost");
    let source = EtcdSource::key(config(&etcd, in_memory), "/gray/rules");
    assert_eq!(
        source.load().await.expect("load over TLS").entries[0].value,
        b"v2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_certificates_give_a_clear_error_not_a_hang() {
    let etcd = Etcd::start_tls().await;
    let tls = etcd.tls().expect("a TLS member");
    let other = Tls::generate();
    etcd.put("/gray/rules", "v1").await;

    let cases = [
        (
            "a CA that did not sign the member's certificate",
            EtcdTls::ca_file(other.ca_file())
                .with_identity_files(tls.client_cert_file(), tls.client_key_file()),
        ),
        (
            "a client certificate the member's CA did not sign",
            EtcdTls::ca_pem(tls.ca_pem())
                .with_identity_pem(other.client_cert_pem(), other.client_key_pem()),
        ),
        ("no client certificate", EtcdTls::ca_pem(tls.ca_pem())),
    ];
    for (case, wrong) in cases {
        let source = EtcdSource::key(config(&etcd, wrong), "/gray/rules");
        let error = tokio::time::timeout(WAIT, source.load())
            .await
            .unwrap_or_else(|_| panic!("{case}: load hung"))
            .expect_err(case);
        let text = error.to_string();
        assert!(
            text.contains("check the TLS settings"),
            "{case}: {text} ({error:?})"
        );

        let mut follow = Follow::start(&source);
        let status = follow.status_until(case, |s| s.failures > 0).await;
        assert!(!status.connected, "{case}");
        assert!(
            status
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("check the TLS settings")),
            "{case}: {status:?}"
        );
        // It tries again, and still hands out nothing.
        follow
            .assert_nothing_after_failures(status.failures + 1)
            .await;
    }
}

#[tokio::test]
async fn an_unreadable_certificate_file_names_the_setting() {
    let config = EtcdConfig::new(["https://127.0.0.1:1"])
        .with_tls(EtcdTls::ca_file("/nonexistent/gray-ca.pem"));
    let error = EtcdSource::key(config, "/k").load().await.unwrap_err();
    assert!(
        matches!(
            error,
            SourceError::Config {
                field: "tls.ca_file",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("/nonexistent/gray-ca.pem"),
        "{error}"
    );
}
