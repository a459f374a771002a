//! The project's own tooling, in the project's language: `cargo xtask <command>` (the alias
//! is in `.cargo/config.toml`).
//!
//! ```text
//! cargo xtask bench-gateway [options]   # the gateway against nginx, HAProxy and a minimal hyper proxy
//! cargo xtask bench-gateway --help      # its targets, modes and settings
//! ```
//!
//! The xtask itself uses std only, so that it compiles in seconds; what it measures is built
//! by it with the profile being measured (the upstream and the minimal proxy live in
//! `xtask/bench-support`). See the `bench` module for how a benchmark run goes and how to
//! add a target or a mode.

use std::process::ExitCode;

mod bench;

const USAGE: &str = "usage: cargo xtask <command> [options]

commands:
  bench-gateway   what the gray gateway costs per request, side by side with nginx, HAProxy
                  and a minimal hyper proxy (`cargo xtask bench-gateway --help`)";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("bench-gateway") => bench::main(args.collect()),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("xtask: unknown command `{other}`\n{USAGE}");
            ExitCode::from(2)
        }
        None => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
