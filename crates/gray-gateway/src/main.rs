//! The `gray-gateway` binary.
//!
//! ```text
//! gray-gateway --config gateway.toml     # run
//! gray-gateway --check gateway.toml      # validate the configuration and the files it names
//! gray-gateway rollout status --admin 127.0.0.1:9901 orders   # a rollout, through the admin API
//! ```
//!
//! See the crate docs for what it does and the configuration reference.

// A command-line program ends with the status it reports, like `nginx -t`.
#![allow(clippy::exit)]

mod rollout_cli;

use std::path::PathBuf;

use gray_gateway::{Gateway, config::Config};

/// mimalloc returns the pages of freed memory to the system (its purge), so the buffers
/// that idle connections drop when they are parked shrink the process; glibc's malloc
/// keeps them for reuse.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage: gray-gateway --config <gateway.toml>
       gray-gateway --check <gateway.toml>   validate it and the files it names, print what would run
";

fn usage() -> ! {
    eprintln!("{USAGE}{}", rollout_cli::USAGE);
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("rollout") {
        args.next();
        std::process::exit(rollout_cli::main(args));
    }
    let mut config_path = None;
    let mut check = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--config" | "-c" => {
                config_path = Some(args.next().map(PathBuf::from).unwrap_or_else(|| usage()))
            }
            "--check" | "-t" => check = true,
            "--help" | "-h" => {
                println!("{USAGE}{}", rollout_cli::USAGE);
                return;
            }
            other if check && config_path.is_none() && !other.starts_with('-') => {
                config_path = Some(PathBuf::from(other));
            }
            other => {
                eprintln!("unknown argument `{other}`");
                usage()
            }
        }
    }
    let Some(config_path) = config_path else {
        usage()
    };
    if check {
        std::process::exit(run_check(&config_path));
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    gray_gateway::raise_nofile_limit();
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
    let config_listens_plain = config.listen.is_some();
    let result = runtime.block_on(async {
        let gateway = Gateway::start(config).await?;
        if config_listens_plain {
            println!("gateway listening on http://{}", gateway.addr());
        }
        if let Some(tls) = gateway.tls_addr() {
            println!("gateway listening on https://{tls}");
        }
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

/// `--check`: 0 and the summary on stdout, or 1 and the error on stderr.
fn run_check(path: &std::path::Path) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(gray_gateway::check::check(path)) {
        Ok(summary) => {
            print!("{summary}");
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            eprintln!("{}: the configuration is invalid", path.display());
            1
        }
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
