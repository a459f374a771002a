//! A minimal WebDriver client: Debian's headless Chromium driven through chromedriver,
//! W3C WebDriver (JSON over HTTP) with reqwest, for the tests of pages a person sees.
//!
//! [`Browser::start`] runs chromedriver on a free loopback port and opens one headless
//! session, with a fresh profile and every background service of the browser off, so the
//! browser contacts no host but the ones a test sends it to. Prompts (`alert`, `confirm`,
//! `prompt`) are left open for the test to handle ([`Browser::alert_text`],
//! [`Browser::accept_alert`], …): while one is open, any other command fails.
//!
//! Every WebDriver error panics, naming the command, the error and its message; the two
//! that are answers ("no such element", "no such alert") are `None` where the API says so.
//!
//! Dropping a [`Browser`] deletes its session (chromedriver quits Chromium, which survives a
//! killed chromedriver otherwise), kills chromedriver, and removes the profile.

mod base64;
mod commands;
mod wire;

use std::{
    net::{Ipv4Addr, TcpListener},
    path::PathBuf,
    process::Stdio,
    sync::Mutex,
    time::Duration,
};

use crate::TempDir;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use wire::{delete_session, request, wait_ready};

/// The key of an element reference in WebDriver's JSON (W3C WebDriver, "Elements").
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long chromedriver may take to answer `GET /status` with `ready: true`.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// How long one command may take (a session's start, which launches Chromium, included):
/// generous, for a loaded machine. Page loads are bounded below it (`timeouts.pageLoad`).
const COMMAND_WITHIN: Duration = Duration::from_secs(90);

/// The interval of every poll: chromedriver's readiness, [`Browser::wait_for`],
/// [`Browser::wait_until`].
const POLL: Duration = Duration::from_millis(50);

/// A headless Chromium session driven through chromedriver; the session, chromedriver and
/// the browser's profile are gone when it is dropped.
///
/// Its methods panic on any WebDriver error, naming the command, the error and its message.
#[derive(Debug)]
pub struct Browser {
    driver: Child,
    client: reqwest::Client,
    port: u16,
    session: String,
    /// Chromium's process id (`goog:processID`), killed on drop if deleting the session
    /// did not end it.
    chromium_pid: Option<u32>,
    /// The console's entries read so far: chromedriver hands each one out once.
    console: Mutex<Vec<Value>>,
    /// Holds `profile/` (Chromium's `--user-data-dir`), `chromedriver.log`, and `config/`
    /// and `cache/` (Chromium's `$XDG_CONFIG_HOME` and `$XDG_CACHE_HOME`).
    dir: TempDir,
}

/// A reference to an element of the current page, as WebDriver hands it out (stale once
/// the page changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element(String);

impl Element {
    /// The element as WebDriver's JSON reference, to pass it to [`Browser::execute`] as
    /// an argument (the script sees the DOM element).
    #[must_use]
    pub fn to_json(&self) -> Value {
        json!({ ELEMENT_KEY: self.0 })
    }
}

/// A binary from the environment variable `var`, or `default`; panics when it is missing.
fn binary(var: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    assert!(
        path.is_file(),
        "{} not found (set ${var} to another path): the browser tests need Debian's packages \
         `chromium` and `chromium-driver` (`apt-get install chromium chromium-driver`), which \
         `scripts/test` installs",
        path.display()
    );
    path
}

/// A free loopback port: bound, then released for chromedriver to bind.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// The last lines of chromedriver's log, for a panic message.
fn log_tail(dir: &TempDir) -> String {
    let log = std::fs::read_to_string(dir.path().join("chromedriver.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

// === impl Browser ===

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless Chromium session.
    ///
    /// Binaries: `$CHROMIUM` or `/usr/bin/chromium`, `$CHROMEDRIVER` or
    /// `/usr/bin/chromedriver`.
    ///
    /// # Panics
    ///
    /// When a binary is missing (naming the Debian packages `chromium` and
    /// `chromium-driver`, which `scripts/test` installs), when chromedriver is not ready
    /// within 30 s, or when the session does not start (with chromedriver's last log lines).
    pub async fn start() -> Browser {
        let chromium = binary("CHROMIUM", "/usr/bin/chromium");
        let chromedriver = binary("CHROMEDRIVER", "/usr/bin/chromedriver");
        let dir = TempDir::new("browser");
        let profile = dir.path().join("profile");
        std::fs::create_dir(&profile).expect("create the browser's profile directory");
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(COMMAND_WITHIN)
            .build()
            .expect("a reqwest client");

        // The port is free when picked, not necessarily when chromedriver binds it: another
        // try on another port if chromedriver exits before it is ready.
        let mut tries = 0;
        let (driver, port) = loop {
            tries += 1;
            let port = free_port();
            let mut driver = Command::new(&chromedriver)
                .arg(format!("--port={port}"))
                .arg(format!(
                    "--log-path={}",
                    dir.path().join("chromedriver.log").display()
                ))
                // Chromium writes outside `--user-data-dir` too: crash reports under
                // `$XDG_CONFIG_HOME/chromium`, a disk cache under `$XDG_CACHE_HOME/profile`,
                // dconf's under `$XDG_CACHE_HOME/dconf`: all into `dir`, not `$HOME`.
                .env("XDG_CONFIG_HOME", dir.path().join("config"))
                .env("XDG_CACHE_HOME", dir.path().join("cache"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", chromedriver.display()));
            match wait_ready(&client, port, &mut driver).await {
                Ok(()) => break (driver, port),
                Err(exit) if tries < 3 => {
                    eprintln!("chromedriver on port {port} exited ({exit}); trying another port");
                }
                Err(exit) => panic!(
                    "chromedriver exited before it was ready ({exit}), {tries} times:\n{}",
                    log_tail(&dir)
                ),
            }
        };

        let capabilities = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "unhandledPromptBehavior": "ignore",
                    "timeouts": { "implicit": 0, "pageLoad": 60_000, "script": 30_000 },
                    "goog:loggingPrefs": { "browser": "ALL" },
                    "goog:chromeOptions": {
                        "binary": chromium,
                        "args": [
                            "--headless=new",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--disable-dev-shm-usage",
                            "--window-size=1280,1800",
                            format!("--user-data-dir={}", profile.display()),
                            "--no-first-run",
                            "--disable-background-networking",
                            "--disable-component-update",
                            "--disable-default-apps",
                            "--disable-sync",
                            // loopback pages straight, whatever proxy the environment names
                            "--no-proxy-server",
                        ],
                    },
                },
            },
        });
        let url = format!("http://127.0.0.1:{port}/session");
        let value = match request(&client, reqwest::Method::POST, &url, Some(&capabilities)).await {
            Ok(value) => value,
            Err(e) => panic!(
                "POST /session (a headless Chromium session): {e}\nchromedriver's log:\n{}",
                log_tail(&dir)
            ),
        };
        let session = value["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("POST /session: no sessionId in {value}"))
            .to_owned();
        let chromium_pid = value["capabilities"]["goog:processID"]
            .as_u64()
            .and_then(|pid| u32::try_from(pid).ok());
        Browser {
            driver,
            client,
            port,
            session,
            chromium_pid,
            console: Mutex::new(Vec::new()),
            dir,
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Chromium outlives a killed chromedriver: deleting the session makes chromedriver
        // quit it (and answer once it has). Blocking, with std: drop cannot await.
        delete_session(self.port, &self.session);
        let _ = self.driver.start_kill();
        // If Chromium is still running (the deletion failed), it is killed; its other
        // processes exit with it. The profile in its command line tells a reused pid apart.
        if let Some(pid) = self.chromium_pid {
            let profile = self.dir.path().join("profile");
            let ours = std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                String::from_utf8_lossy(&cmdline).contains(&*profile.to_string_lossy())
            });
            if ours {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        // `dir` (the profile) is removed when the fields drop, after this.
    }
}
