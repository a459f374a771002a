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

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    process::Stdio,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::TempDir;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

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

/// A WebDriver error answer: `value.error` and `value.message`.
#[derive(Debug)]
struct WebDriverError {
    error: String,
    message: String,
}

impl std::fmt::Display for WebDriverError {
    /// `error: message`, the error once: chromedriver's messages often start with it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.message.starts_with(&self.error) {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.error, self.message)
        }
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

    /// Sends one command of the session (`path` after `/session/{id}`), returning its
    /// `value` or its error.
    async fn try_command(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, WebDriverError> {
        let url = format!(
            "http://127.0.0.1:{}/session/{}{path}",
            self.port, self.session
        );
        request(&self.client, method, &url, body).await
    }

    /// [`try_command`](Self::try_command), panicking on an error.
    async fn command(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Value {
        let name = format!("{method} {path}");
        self.try_command(method, path, body)
            .await
            .unwrap_or_else(|e| panic!("WebDriver {name}: {e}"))
    }

    /// `POST path` with `body`, panicking on an error.
    async fn post(&self, path: &str, body: &Value) -> Value {
        self.command(reqwest::Method::POST, path, Some(body)).await
    }

    /// `GET path`, panicking on an error.
    async fn get(&self, path: &str) -> Value {
        self.command(reqwest::Method::GET, path, None).await
    }

    /// Opens `url` and waits for it to load (at most 60 s).
    pub async fn goto(&self, url: &str) {
        self.post("/url", &json!({ "url": url })).await;
    }

    /// The first element matching the CSS selector `css`, if any (no waiting).
    pub async fn find(&self, css: &str) -> Option<Element> {
        let body = json!({ "using": "css selector", "value": css });
        match self
            .try_command(reqwest::Method::POST, "/element", Some(&body))
            .await
        {
            Ok(value) => Some(element(&value, css)),
            Err(e) if e.error == "no such element" => None,
            Err(e) => panic!("WebDriver POST /element {css:?}: {e}"),
        }
    }

    /// Every element matching the CSS selector `css`, in document order (no waiting).
    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        let value = self
            .post(
                "/elements",
                &json!({ "using": "css selector", "value": css }),
            )
            .await;
        value
            .as_array()
            .unwrap_or_else(|| panic!("POST /elements {css:?}: not an array: {value}"))
            .iter()
            .map(|v| element(v, css))
            .collect()
    }

    /// Polls (bounded: `within`) until `css` matches, panicking with what it waited for.
    pub async fn wait_for(&self, css: &str, within: Duration) -> Element {
        let start = Instant::now();
        loop {
            if let Some(el) = self.find(css).await {
                return el;
            }
            if start.elapsed() >= within {
                let url = self.get("/url").await;
                panic!("no element matches {css:?} within {within:?} (page {url})");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The rendered text of `el` (its `innerText`, as a person sees it).
    pub async fn text(&self, el: &Element) -> String {
        let value = self.get(&format!("/element/{}/text", el.0)).await;
        value
            .as_str()
            .unwrap_or_else(|| panic!("GET /element/…/text: not a string: {value}"))
            .to_owned()
    }

    /// Clicks `el` (scrolled into view; fails if another element would receive the click).
    pub async fn click(&self, el: &Element) {
        self.post(&format!("/element/{}/click", el.0), &json!({}))
            .await;
    }

    /// Types `text` into `el` (focused first), after what it already holds.
    pub async fn send_keys(&self, el: &Element, text: &str) {
        self.post(
            &format!("/element/{}/value", el.0),
            &json!({ "text": text }),
        )
        .await;
    }

    /// Empties the input or text area `el`.
    pub async fn clear(&self, el: &Element) {
        self.post(&format!("/element/{}/clear", el.0), &json!({}))
            .await;
    }

    /// Runs `script` (a function body, `return ...`) with `args`, returning its value.
    ///
    /// `args` are the script's `arguments`; an [`Element::to_json`] is the DOM element. A
    /// returned DOM element comes back as a reference (`{"element-6066-…": id}`).
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Value {
        self.post("/execute/sync", &json!({ "script": script, "args": args }))
            .await
    }

    /// Polls `script` (must return a boolean) until true, bounded by `within`, panicking with `what`.
    pub async fn wait_until(&self, script: &str, within: Duration, what: &str) {
        let start = Instant::now();
        loop {
            match self.execute(script, Vec::new()).await {
                Value::Bool(true) => return,
                Value::Bool(false) => {}
                other => panic!("wait_until ({what}): {script:?} returned {other}, not a boolean"),
            }
            assert!(start.elapsed() < within, "{what}: not within {within:?}");
            tokio::time::sleep(POLL).await;
        }
    }

    /// The open alert/confirm/prompt's text, if one is open.
    pub async fn alert_text(&self) -> Option<String> {
        match self
            .try_command(reqwest::Method::GET, "/alert/text", None)
            .await
        {
            Ok(Value::String(text)) => Some(text),
            Ok(other) => panic!("GET /alert/text: not a string: {other}"),
            Err(e) if e.error == "no such alert" => None,
            Err(e) => panic!("WebDriver GET /alert/text: {e}"),
        }
    }

    /// Accepts the open alert/confirm/prompt (OK): `confirm()` returns `true`.
    pub async fn accept_alert(&self) {
        self.post("/alert/accept", &json!({})).await;
    }

    /// Dismisses the open alert/confirm/prompt (Cancel): `confirm()` returns `false`,
    /// `prompt()` `null`.
    pub async fn dismiss_alert(&self) {
        self.post("/alert/dismiss", &json!({})).await;
    }

    /// Types into an open prompt(), then accepts it.
    pub async fn answer_prompt(&self, text: &str) {
        self.post("/alert/text", &json!({ "text": text })).await;
        self.accept_alert().await;
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        let value = self.get("/screenshot").await;
        let encoded = value
            .as_str()
            .unwrap_or_else(|| panic!("GET /screenshot: not a string: {value}"));
        base64_decode(encoded).expect("GET /screenshot: valid base64")
    }

    /// The browser console's log entries so far (goog:loggingPrefs browser ALL), as JSON values.
    ///
    /// Each entry is `{"level", "message", "source", "timestamp"}` as chromedriver reports it
    /// (`level` `INFO` for `console.log`, `SEVERE` for `console.error` and failed loads).
    pub async fn console_log(&self) -> Vec<Value> {
        let value = self.post("/se/log", &json!({ "type": "browser" })).await;
        let new = value
            .as_array()
            .unwrap_or_else(|| panic!("POST /se/log: not an array: {value}"));
        let mut console = self.console.lock().expect("the console log's lock");
        console.extend(new.iter().cloned());
        console.clone()
    }
}

/// Waits until chromedriver on `port` reports `ready`, or returns how it exited.
async fn wait_ready(client: &reqwest::Client, port: u16, driver: &mut Child) -> Result<(), String> {
    let start = Instant::now();
    let url = format!("http://127.0.0.1:{port}/status");
    loop {
        if let Some(status) = driver.try_wait().expect("chromedriver's status") {
            return Err(status.to_string());
        }
        if let Ok(response) = client
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            && let Ok(status) = response.json::<Value>().await
            && status["value"]["ready"] == true
        {
            return Ok(());
        }
        assert!(
            start.elapsed() < READY_WITHIN,
            "chromedriver on port {port} not ready within {READY_WITHIN:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Sends one WebDriver request, returning the answer's `value` or its error.
async fn request(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
) -> Result<Value, WebDriverError> {
    let mut builder = client.request(method.clone(), url);
    if let Some(body) = body {
        builder = builder.json(body);
    }
    let response = builder
        .send()
        .await
        .unwrap_or_else(|e| panic!("WebDriver {method} {url}: {e}"));
    let status = response.status();
    let mut answer: Value = response
        .json()
        .await
        .unwrap_or_else(|e| panic!("WebDriver {method} {url} ({status}): not JSON: {e}"));
    let value = answer["value"].take();
    match value.get("error").and_then(Value::as_str) {
        Some(error) => Err(WebDriverError {
            error: error.to_owned(),
            message: value["message"].as_str().unwrap_or_default().to_owned(),
        }),
        None => Ok(value),
    }
}

/// The element of a reference `{"element-6066-…": id}` (found with `css`).
fn element(value: &Value, css: &str) -> Element {
    let id = value[ELEMENT_KEY]
        .as_str()
        .unwrap_or_else(|| panic!("{css:?}: not an element reference: {value}"));
    Element(id.to_owned())
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

/// `DELETE /session/{session}` on chromedriver at `port`, over a hand-written HTTP/1.1
/// request, waiting (at most 15 s) for the answer; best effort.
fn delete_session(port: u16, session: &str) {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let request = format!(
        "DELETE /session/{session} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\
         Connection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return;
    }
    // The answer comes once Chromium has quit. chromedriver says `Connection: close` but
    // keeps the connection open: the answer ends after its `Content-Length`.
    let mut answer = Vec::new();
    let mut buf = [0; 4096];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
        if answer_complete(&answer) {
            return;
        }
    }
}

/// Whether `answer` holds a whole HTTP/1.1 answer: its head, and as many bytes of body as
/// its `Content-Length` says (none without one).
fn answer_complete(answer: &[u8]) -> bool {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let length = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse::<usize>().ok())
        .unwrap_or(0);
    answer.len() >= end + 4 + length
}

/// Decodes standard base64 (RFC 4648, alphabet `A–Z a–z 0–9 + /`, `=` padding optional),
/// ignoring ASCII whitespace; `None` when `text` is not base64.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        Some(u32::from(v))
    }
    let bytes: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let data = bytes
        .strip_suffix(b"==")
        .or_else(|| bytes.strip_suffix(b"="))
        .unwrap_or(&bytes);
    // a padded text comes in whole quads
    if data.len() != bytes.len() && !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(data.len() / 4 * 3 + 2);
    for chunk in data.chunks(4) {
        let mut acc = 0u32;
        for &c in chunk {
            acc = (acc << 6) | sextet(c)?;
        }
        // the chunk's bits, most significant first, as whole bytes; left-over bits must be 0
        let bits = 6 * chunk.len();
        let whole = bits / 8;
        if whole == 0 || acc & ((1 << (bits % 8)) - 1) != 0 {
            return None;
        }
        let acc = acc >> (bits % 8);
        for i in (0..whole).rev() {
            out.push(((acc >> (8 * i)) & 0xff) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::{answer_complete, base64_decode};

    #[test]
    fn base64_decodes_rfc_4648_vectors() {
        // RFC 4648, section 10
        for (encoded, decoded) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ] {
            assert_eq!(
                base64_decode(encoded).as_deref(),
                Some(decoded.as_bytes()),
                "{encoded}"
            );
        }
        // unpadded, and with line breaks
        assert_eq!(base64_decode("Zm9vYg").as_deref(), Some(&b"foob"[..]));
        assert_eq!(
            base64_decode("Zm9v\r\nYmFy\n").as_deref(),
            Some(&b"foobar"[..])
        );
    }

    #[test]
    fn base64_decodes_every_byte() {
        // the 256 byte values, encoded by `base64` (coreutils)
        let all: Vec<u8> = (0..=255).collect();
        let encoded = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4\
                       OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3Bx\
                       cnN0dXZ3eHl6e3x9fn+AgYKDhIWGh4iJiouMjY6PkJGSk5SVlpeYmZqbnJ2en6ChoqOkpaanqKmq\
                       q6ytrq+wsbKztLW2t7i5uru8vb6/wMHCw8TFxsfIycrLzM3Oz9DR0tPU1dbX2Nna29zd3t/g4eLj\
                       5OXm5+jp6uvs7e7v8PHy8/T19vf4+fr7/P3+/w==";
        assert_eq!(base64_decode(encoded), Some(all));
    }

    #[test]
    fn an_answer_ends_after_its_content_length() {
        // chromedriver's answer to `DELETE /session/{id}`, which it does not close
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length:14\r\nContent-Type:application/json; \
                       charset=utf-8\r\nConnection:close\r\n\r\n{\"value\":null}";
        assert!(answer_complete(answer));
        assert!(!answer_complete(&answer[..answer.len() - 1]));
        assert!(!answer_complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n"
        ));
        assert!(answer_complete(b"HTTP/1.1 204 No Content\r\n\r\n"));
    }

    #[test]
    fn base64_rejects_what_is_not() {
        for bad in ["Zm9v!", "Z", "Zm9vY", "Zg=", "Zh==", "Z===", "Zm=v", "-_8="] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }
}
