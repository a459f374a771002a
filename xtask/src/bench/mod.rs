//! `cargo xtask bench-gateway`: what the gray gateway costs per request, side by side with
//! nginx, HAProxy and a minimal hyper proxy doing the same header routing (issue 16).
//!
//! ```text
//! cargo xtask bench-gateway                                    # CPU per request (5 rounds of 5 s)
//! cargo xtask bench-gateway --rounds 3 --duration 3            # the same as ROUNDS=3 DURATION=3
//! cargo xtask bench-gateway --syscalls                         # system calls and context switches per request
//! cargo xtask bench-gateway --targets nginx-tls,gateway-tls --refs nginx-tls   # TLS keep-alive
//! cargo xtask bench-gateway --idle-memory --targets nginx-tls,gateway-tls      # memory per idle connection
//! PROFILE=profiling cargo xtask bench-gateway --instructions   # instructions per request, by function and crate
//! BIN_BEFORE=/tmp/gray-gateway.before cargo xtask bench-gateway --targets gateway#before,gateway,bare
//! ```
//!
//! `--help` lists the targets, the modes and every setting (a flag, or the environment
//! variable of the same name: `--ins-duration 10` or `INS_DURATION=10`).
//!
//! # What a run does, all on 127.0.0.1
//!
//! 1. finds nginx, haproxy and wrk (and valgrind for `--instructions`, perf or strace for
//!    `--syscalls`), installing the missing ones from Debian packages; builds `bench-support`
//!    (the `upstream` and `bare-proxy` binaries) and the gateway with each profile named;
//! 2. starts four upstreams (the `upstream` binary, one process, four listeners) pinned to
//!    `LOAD_CPU`: base-1, base-2 (baseline), gray-1, gray-2 (labelled `gray=true`), each
//!    answering its id in `x-instance` and the path it saw in `x-seen-path`;
//! 3. writes each target's configuration into a temp directory (from the string templates in
//!    [`kinds`]) and starts the targets pinned to `PROXY_CPU` (`taskset`);
//! 4. checks each target's routing before measuring: 20 unstained requests must reach only
//!    base-*, 20 with `x-gray-lane: gray` only gray-*, each with `/svc` stripped, both
//!    instances of the lane serving;
//! 5. measures (the [`modes`]); wrk (`-t1`, pinned to `LOAD_CPU`) sends every other request
//!    with `x-gray-lane: gray`. A run fails if any target answered a non-2xx status or had
//!    socket errors.
//!
//! Every process it starts is stopped when it ends, failure included; if it is killed,
//! they get SIGTERM (`setpriv --pdeathsig`, where util-linux has it; on Ctrl-C in a terminal
//! they get the signal anyway, being in its process group). The temp directory
//! (configurations, logs, callgrind dumps, perf output) is removed, unless `--keep` or the
//! run failed (or it was killed). Machine load is printed before and after: numbers taken while
//! something else compiles are noise.
//!
//! # The code
//!
//! - [`options`] and [`settings`]: the command line and the environment;
//! - [`tools`]: finding and installing programs, cargo builds;
//! - [`harness`]: the temp directory, the processes, the upstreams, starting targets,
//!   routing checks ([`probe`]), load ([`wrk`]);
//! - [`kinds`]: one file per kind of target (`nginx`, `haproxy`, `gateway`, `bare`);
//! - [`modes`]: one file per mode (`cpu`, `instructions`, `syscalls`);
//! - [`procfs`] and [`report`]: what is read from /proc, and medians and tables.
//!
//! ## Adding a target
//!
//! A kind of target is a type implementing [`kinds::Kind`], in its own file under `kinds/`:
//!
//! 1. `name` (what `--targets` calls it) and `about` (its `--help` entry);
//! 2. `program`: a system program (`Program::System`, found on the PATH or installed from
//!    its Debian package) or a binary of this workspace (`Program::Cargo`: built with the
//!    profile, and taking `@PROFILE` and `#LABEL` in `--targets`);
//! 3. `configure`: write its configuration from a string template into the target's own
//!    directory (listening on `setup.listen`, routing to `setup.upstreams`), check it with
//!    the program where the program can, and return the [`kinds::Launch`] (arguments,
//!    environment, a description for the log);
//! 4. `cpu_pids` and `serving_pids` when it forks (nginx: master and workers).
//!
//! Then add it to [`kinds::KINDS`]. Builds, pinning, the routing checks, every mode and every
//! table pick it up. A variant of an existing target (the gateway with evidence recording
//! on, say) is a second value of the same type with a different name and template, as
//! `bare` and `bare-gray` are.
//!
//! ## Adding a mode
//!
//! A mode is a type implementing [`modes::Mode`], in its own file under `modes/`: its `flag`
//! (`--instructions`), its `about`, the `tools` it needs beyond wrk, whether targets must run
//! as one process under it (`one_process`) or are slow to answer (`slow_targets`), and `run`,
//! which drives the [`harness::Bench`]: `start_all` (start, check, warm up) or `start_target`
//! under a wrapper command, `load` (one wrk run), `cpu_pids` / `serving_pids`, the readers in
//! [`procfs`], and prints its table with [`report`]. Then add it to [`modes::MODES`]. Memory
//! per idle connection, say, is `start_all`, opening the connections, and `VmRSS` of
//! `serving_pids` before and after.
//!
//! ## TLS
//!
//! `nginx-tls` and `gateway-tls` ([`kinds::Kind::tls`]) serve the run's certificate (made
//! with `openssl` when a TLS target runs) on a [`kinds::Tls`] listener of their own, beside
//! their plaintext `listen`, which still serves the start-up checks; the routing is also
//! checked over TLS with curl ([`probe::check_tls_lane`]) and wrk loads the `https` URL.
//! `NEW_CONNECTIONS=1` sends `Connection: close` with every request: a full handshake per
//! request. `--idle-memory` measures memory per idle keep-alive connection on both
//! listeners.
//!
//! ## Where the planned additions go
//!
//! - HTTP/2 upstreams: an HTTP/2 listener in bench-support's `upstream`, and the protocol in
//!   [`kinds::Upstreams`], which the templates read.
//! - The cost of recording evidence: a second value of the gateway's kind with recording
//!   on, compared with `gateway` in one interleaved run.

use std::process::ExitCode;

mod harness;
mod kinds;
mod modes;
mod options;
mod probe;
mod procfs;
mod report;
mod settings;
mod tools;
mod wrk;

use options::{Command, Options};

/// What every step returns: the error is a message that says what failed and why.
pub(crate) type Result<T, E = String> = std::result::Result<T, E>;

/// Runs `cargo xtask bench-gateway` with the arguments after the command.
pub(crate) fn main(args: Vec<String>) -> ExitCode {
    let options = match options::parse(&args, &|name| std::env::var(name).ok()) {
        Ok(Command::Help) => {
            print!("{}", options::help());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run(options)) => options,
        Err(message) => {
            eprintln!("bench-gateway: {message} (see --help)");
            return ExitCode::from(2);
        }
    };
    let dir = match harness::TempDir::new() {
        Ok(dir) => dir,
        Err(message) => {
            eprintln!("bench-gateway: {message}");
            return ExitCode::FAILURE;
        }
    };
    // Every process the run started is stopped when `run` returns; the directory outlives
    // them.
    let result = run(&options, &dir);
    if let Err(message) = &result {
        eprintln!("bench-gateway: {message}");
    }
    dir.close(result.is_err() || options.keep);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

fn run(options: &Options, dir: &harness::TempDir) -> Result<()> {
    step(&format!(
        "machine: {} CPUs; load: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        report::uptime()
    ));
    if std::thread::available_parallelism().is_ok_and(|n| n.get() < 2) {
        eprintln!(
            "bench-gateway: warning: fewer than 2 CPUs, pinning cannot separate load and targets"
        );
    }
    let tools = tools::prepare(options)?;
    let builds = tools::build(options, &tools)?;
    let mut bench = harness::Bench::new(options, dir, &builds)?;
    options.mode.run(&mut bench)
}

/// Prints a step of the run, as its heading.
pub(crate) fn step(what: &str) {
    println!("\n==> {what}");
}
