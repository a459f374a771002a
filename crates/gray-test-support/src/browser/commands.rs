//! The commands of a session: the page ([`Browser::goto`]), its elements found, read,
//! clicked and typed into, scripts run and waited on, prompts answered, a screenshot and
//! the console's log.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{
    Browser, ELEMENT_KEY, Element, POLL,
    base64::base64_decode,
    wire::{WebDriverError, request},
};

// === impl Browser ===

impl Browser {
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

/// The element of a reference `{"element-6066-…": id}` (found with `css`).
fn element(value: &Value, css: &str) -> Element {
    let id = value[ELEMENT_KEY]
        .as_str()
        .unwrap_or_else(|| panic!("{css:?}: not an element reference: {value}"));
    Element(id.to_owned())
}
