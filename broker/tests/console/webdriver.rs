//! A small WebDriver client for the console's tests: Debian's `chromium`
//! driven by its `chromedriver` (both installed by
//! `ops/install-check-tools.sh`), spoken to over the W3C WebDriver HTTP
//! protocol on loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use crate::support::eventually;

/// How long a page has to show what a step waits for.
pub const PAGE_DEADLINE: Duration = Duration::from_secs(30);
/// How long one command to chromedriver may take (starting the browser
/// is the longest).
const DRIVER_DEADLINE: Duration = Duration::from_secs(60);
/// The key WebDriver names an element's reference with.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A running chromedriver with one headless Chromium session.
pub struct Browser {
    driver: Child,
    addr: String,
    session: String,
    _profile: tempfile::TempDir,
}

/// The driver and the browser, if installed. Missing: `None` (the test is
/// skipped), unless `NARAD_OPS_CHECKS=required` (as in `.ci/run`).
pub fn installed() -> Option<(PathBuf, PathBuf)> {
    let find = |name: &str| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|path| path.is_file())
        })
    };
    let browser = find("chromium").or_else(|| find("chromium-browser"));
    match (find("chromedriver"), browser) {
        (Some(driver), Some(browser)) => Some((driver, browser)),
        _ => {
            assert!(
                std::env::var("NARAD_OPS_CHECKS").map_or(true, |v| v != "required"),
                "chromium and chromedriver are missing: run ops/install-check-tools.sh"
            );
            eprintln!(
                "skipped: chromium or chromedriver is not installed (ops/install-check-tools.sh)"
            );
            None
        }
    }
}

/// One plain HTTP request on a fresh connection, with `headers` and no
/// others (the request helpers of `support` add a node's own credential).
/// Its `Host` names the address: chromedriver refuses any other host.
pub fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<(u16, Value), String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(DRIVER_DEADLINE))
        .map_err(|e| e.to_string())?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()))
        .map_err(|e| e.to_string())?;
    // The connection may stay open: read the head, then as many
    // bytes as it says.
    let mut response = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    let (split, length) = loop {
        let read = stream.read(&mut chunk).map_err(|e| e.to_string())?;
        if read == 0 {
            return Err("the connection closed before a whole answer".into());
        }
        response.extend_from_slice(&chunk[..read]);
        if let Some(split) = response.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or("an answer without Content-Length")?;
            break (split, length);
        }
    };
    while response.len() < split + 4 + length {
        let read = stream.read(&mut chunk).map_err(|e| e.to_string())?;
        if read == 0 {
            return Err("the connection closed before a whole answer".into());
        }
        response.extend_from_slice(&chunk[..read]);
    }
    let head = String::from_utf8_lossy(&response[..split]);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    Ok((
        status,
        serde_json::from_slice(&response[split + 4..split + 4 + length]).unwrap_or(Value::Null),
    ))
}

fn http(addr: &str, method: &str, path: &str, body: &str) -> Result<(u16, Value), String> {
    http_with(addr, method, path, &[], body)
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Browser {
    /// Starts chromedriver and a headless Chromium `width` x `height`
    /// pixels, logging every console message.
    pub fn start(driver: &std::path::Path, browser: &std::path::Path) -> Self {
        let port = free_tcp_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let addr = format!("127.0.0.1:{port}");
        let profile = tempfile::tempdir().expect("profile dir");
        let mut browser_ = Self {
            driver: child,
            addr,
            session: String::new(),
            _profile: profile,
        };
        assert!(
            eventually(PAGE_DEADLINE, || {
                http(&browser_.addr, "GET", "/status", "")
                    .is_ok_and(|(_, v)| v["value"]["ready"] == true)
            }),
            "chromedriver did not become ready"
        );
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": browser,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,800", "--hide-scrollbars", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    format!("--user-data-dir={}", browser_._profile.path().display()),
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let (status, answer) = browser_.call("POST", "/session", &capabilities);
        assert_eq!(status, 200, "a browser session: {answer}");
        browser_.session = answer["value"]["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        browser_
    }

    fn call(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let body = if method == "GET" || method == "DELETE" {
            String::new()
        } else {
            body.to_string()
        };
        http(&self.addr, method, path, &body)
            .unwrap_or_else(|e| panic!("chromedriver {method} {path}: {e}"))
    }

    /// A command of the session; panics with the driver's error.
    fn command(&self, method: &str, path: &str, body: Value) -> Value {
        let (status, answer) =
            self.call(method, &format!("/session/{}{path}", self.session), &body);
        assert_eq!(status, 200, "{method} {path}: {answer}");
        answer["value"].clone()
    }

    pub fn open(&self, url: &str) {
        self.command("POST", "/url", json!({ "url": url }));
    }

    pub fn url(&self) -> String {
        self.command("GET", "/url", json!({}))
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page.
    pub fn run(&self, script: &str, args: Value) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            json!({ "script": script, "args": args }),
        )
    }

    /// The text the page shows in the first element matching `css`.
    pub fn text(&self, css: &str) -> Option<String> {
        self.run(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
            json!([css]),
        )
        .as_str()
        .map(str::to_string)
    }

    /// Waits until the first element matching `css` shows a text for
    /// which `check` holds; that text.
    pub fn wait_text(&self, css: &str, check: impl Fn(&str) -> bool) -> String {
        let mut last = None;
        let found = eventually(PAGE_DEADLINE, || {
            last = self.text(css);
            last.as_deref().is_some_and(&check)
        });
        assert!(
            found,
            "{css} never showed the text wanted; it shows {last:?}"
        );
        last.unwrap_or_default()
    }

    /// Does `steps` to the first element matching `using`/`value` (`css
    /// selector` or `xpath`) once it is shown and enabled. The page
    /// re-renders its figures every few seconds: an element replaced
    /// between finding and acting (a stale reference) is found again.
    fn on_element(&self, using: &str, value: &str, steps: &[(&str, Value)]) {
        let mut last = Value::Null;
        let done = eventually(PAGE_DEADLINE, || {
            let (status, answer) = self.call(
                "POST",
                &format!("/session/{}/element", self.session),
                &json!({ "using": using, "value": value }),
            );
            let Some(id) = answer["value"][ELEMENT].as_str().filter(|_| status == 200) else {
                last = answer;
                return false;
            };
            let session = &self.session;
            let usable = ["displayed", "enabled"].iter().all(|what| {
                self.call(
                    "GET",
                    &format!("/session/{session}/element/{id}/{what}"),
                    &json!({}),
                )
                .1["value"]
                    == true
            });
            if !usable {
                return false;
            }
            for (action, body) in steps {
                let (status, answer) = self.call(
                    "POST",
                    &format!("/session/{session}/element/{id}/{action}"),
                    body,
                );
                if status != 200 {
                    assert_eq!(
                        answer["value"]["error"], "stale element reference",
                        "{action} on {value}: {answer}"
                    );
                    last = answer;
                    return false;
                }
            }
            true
        });
        assert!(done, "no usable element {using} {value:?}: {last}");
    }

    pub fn click(&self, css: &str) {
        self.on_element("css selector", css, &[("click", json!({}))]);
    }

    /// Clicks the button whose text is `label`.
    pub fn press(&self, label: &str) {
        let xpath = format!("//button[normalize-space()='{label}']");
        self.on_element("xpath", &xpath, &[("click", json!({}))]);
    }

    /// Waits until `script` (a function body) returns true in the page.
    pub fn wait_until(&self, script: &str, what: &str) {
        assert!(
            eventually(PAGE_DEADLINE, || self.run(script, json!([])) == true),
            "the page never came to {what}"
        );
    }

    /// Whether the button whose text is `label` is disabled now.
    pub fn disabled(&self, label: &str) -> bool {
        self.run(
            "return Array.from(document.querySelectorAll('button')).some((b) => b.innerText.trim() === arguments[0] && b.disabled);",
            json!([label]),
        ) == true
    }

    /// Types `text` into the field matching `css`, after clearing it, as a
    /// user's keystrokes.
    pub fn fill(&self, css: &str, text: &str) {
        let mut steps = vec![("clear", json!({}))];
        if !text.is_empty() {
            steps.push(("value", json!({ "text": text })));
        }
        self.on_element("css selector", css, &steps);
    }

    /// The console messages logged since the last call: (level, text).
    pub fn console(&self) -> Vec<(String, String)> {
        let entries = self.command("POST", "/se/log", json!({"type": "browser"}));
        entries
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|e| {
                        (
                            e["level"].as_str().unwrap_or_default().to_string(),
                            e["message"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every URL the page has loaded or fetched since it was opened.
    pub fn requested(&self) -> Vec<String> {
        self.run(
            "return performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource')).map((e) => e.name);",
            json!([]),
        )
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|u| u.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
    }

    pub fn resize(&self, width: u32, height: u32) {
        self.command(
            "POST",
            "/window/rect",
            json!({ "width": width, "height": height }),
        );
    }

    /// A PNG of what the window shows, written to `path`.
    pub fn screenshot(&self, path: &std::path::Path) {
        let encoded = self.command("GET", "/screenshot", json!({}));
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap_or_default())
            .expect("a PNG in base64");
        std::fs::write(path, png).expect("write the screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.session.is_empty() {
            // What the page showed when the test failed.
            let shown = http(
                &self.addr,
                "POST",
                &format!("/session/{}/execute/sync", self.session),
                &json!({"script": "return location.href + '\\n' + document.body.innerText;", "args": []}).to_string(),
            );
            let logged = http(
                &self.addr,
                "POST",
                &format!("/session/{}/se/log", self.session),
                &json!({"type": "browser"}).to_string(),
            );
            eprintln!(
                "--- the page when the test failed ---\n{}\n--- its console ---\n{}",
                shown.map_or_else(
                    |e| e,
                    |(_, v)| v["value"].as_str().unwrap_or_default().to_string()
                ),
                logged.map_or_else(|e| e, |(_, v)| v["value"].to_string())
            );
        }
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &format!("/session/{}", self.session), &json!({}));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
