//! Run with: cargo run -p example-gateway -- --config examples/gateway/gateway.toml
//!
//! The gray gateway: stains each request by live rules (stripping stains sent by untrusted
//! clients), routes `/{service}/**` to the instances of `service` that fit the stain with a
//! per-service fallback policy, and serves `/explain`, `/metrics` and `/healthz` on the admin
//! address. See `lib.rs` and `config.rs` for what it does and how to configure it.

use std::path::PathBuf;

use example_gateway::{Gateway, config::Config};

fn usage() -> ! {
    eprintln!("usage: example-gateway --config <gateway.toml>");
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut config_path = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--config" | "-c" => config_path = args.next().map(PathBuf::from),
            "--help" | "-h" => usage(),
            other => {
                eprintln!("unknown argument `{other}`");
                usage()
            }
        }
    }
    let Some(config_path) = config_path else {
        usage()
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let config = match Config::load(&config_path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1)
        }
    };
    // One worker: tokio's current-thread scheduler, which skips the work-stealing machinery.
    let mut runtime = match config.workers {
        1 => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if config.workers > 1 {
        runtime.worker_threads(config.workers);
    }
    let runtime = match runtime.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            std::process::exit(1)
        }
    };
    let result = runtime.block_on(async {
        let gateway = Gateway::start(config).await?;
        println!("gateway listening on http://{}", gateway.addr());
        if let Some(admin) = gateway.admin_addr() {
            println!("admin on http://{admin} (/explain, /metrics, /healthz)");
        }
        shutdown_signal().await;
        tracing::info!("shutting down");
        gateway.shutdown().await;
        Ok::<_, tower::BoxError>(())
    });
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1)
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
