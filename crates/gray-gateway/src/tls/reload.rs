//! Following the files of the `[tls]` table: a new version is checked and installed, or
//! refused while the one in force stays.

use std::{sync::Arc, sync::atomic::Ordering, time::Duration, time::SystemTime};

use futures_util::{StreamExt, stream};
use gray_discovery::source::{Source, Update, WatchHandle, file::FileSource};

use super::{Files, Live, Utc, load, warn_if_expiring};
use crate::config::TlsSettings;

/// Follows the files of `settings`, polled every `interval`, starting from `in_force`
/// (the version installed at start-up); stopped when the handle is dropped.
pub(super) fn follow(
    settings: TlsSettings,
    interval: Duration,
    live: Arc<Live>,
    in_force: Files,
) -> WatchHandle {
    WatchHandle::new(tokio::spawn(run(settings, interval, live, in_force)))
}

/// Which file of the table an update is of.
#[derive(Debug, Clone, Copy)]
enum Which {
    Cert,
    Key,
    ClientCa,
}

async fn run(settings: TlsSettings, interval: Duration, live: Arc<Live>, mut tried: Files) {
    let mut files = vec![
        (Which::Cert, settings.cert_file.clone()),
        (Which::Key, settings.key_file.clone()),
    ];
    if let Some(client) = &settings.client_certs {
        files.push((Which::ClientCa, client.ca_file.clone()));
    }
    let sources: Vec<(Which, FileSource)> = files
        .into_iter()
        .map(|(which, path)| (which, FileSource::new(path).with_interval(interval)))
        .collect();
    // A renewal writes the certificate and the key one after the other (and each may take
    // a settle delay to be handed out): a version is checked once nothing has changed for
    // a polling interval and a settle delay.
    let quiet = interval + sources[0].1.settle();
    let mut updates = stream::select_all(
        sources
            .iter()
            .map(|(which, source)| source.watch().map(move |update| (*which, update))),
    );
    let mut latest = tried.clone();
    while let Some((which, update)) = updates.next().await {
        set(&mut latest, which, update);
        loop {
            match tokio::time::timeout(quiet, updates.next()).await {
                Ok(Some((which, update))) => set(&mut latest, which, update),
                Ok(None) => return,
                Err(_) => break,
            }
        }
        if latest == tried {
            continue;
        }
        tried = latest.clone();
        match load(&settings, &latest, SystemTime::now()) {
            Ok(loaded) => {
                live.install(&loaded);
                tracing::info!(
                    cert_file = %settings.cert_file.display(),
                    not_after = %Utc(loaded.validity.not_after),
                    "TLS certificate files reloaded: new handshakes get the new version"
                );
                warn_if_expiring(&settings, &loaded);
            }
            Err(e) => {
                live.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    error = %e,
                    "new TLS certificate files refused; the previous ones stay in force"
                );
            }
        }
    }
}

/// Records the bytes an update hands out for the file `which`.
fn set(files: &mut Files, which: Which, update: Update) {
    let Update::Reset(snapshot) = update else {
        return;
    };
    let Some(entry) = snapshot.entries.into_iter().next() else {
        return;
    };
    match which {
        Which::Cert => files.cert = entry.value,
        Which::Key => files.key = entry.value,
        Which::ClientCa => files.client_ca = Some(entry.value),
    }
}
