//! `trainyard dashboard` in a real browser: headless Chromium, driven over the DevTools
//! protocol, loads the runs list and a live run's page, sees the run, a chart with points and
//! a rank's log lines, and presses stop; screenshots are kept under the target's temporary
//! folder (`dashboard-screenshots/`).
//!
//! Chromium is looked for at `$TRAINYARD_CHROMIUM`, then on `PATH` (`chromium`, Debian's
//! package, which `scripts/chromium-env.sh` installs). Without it the test skips, saying so;
//! under `CI=true` it fails instead, unless `TRAINYARD_CHROMIUM_SKIP` says why.

use trainyard_test_support::processes as common;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{MARKER, left_behind};
use serde_json::{Value, json};
use trainyard_test_support::dashboard::{Dashboard, KillOnDrop, get};

fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TRAINYARD_CHROMIUM").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| {
            ["chromium", "chromium-browser", "google-chrome"].map(|name| dir.join(name))
        })
        .find(|candidate| candidate.is_file())
}

/// One page of a headless Chromium, spoken to over the DevTools protocol.
struct Browser {
    _process: KillOnDrop,
    _profile: tempfile::TempDir,
    socket: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Browser {
    fn start(program: &Path) -> Self {
        let profile = tempfile::tempdir().expect("a profile folder");
        let process = KillOnDrop(
            Command::new(program)
                .args([
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--window-size=1200,1400",
                    "--remote-debugging-port=0",
                ])
                .arg(format!("--user-data-dir={}", profile.path().display()))
                .arg("about:blank")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("Chromium starts"),
        );
        // Chromium writes the port it took into the profile.
        let file = profile.path().join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(60);
        let port: u16 = loop {
            if let Some(port) = std::fs::read_to_string(&file)
                .ok()
                .and_then(|text| text.lines().next()?.parse().ok())
            {
                break port;
            }
            assert!(
                Instant::now() < deadline,
                "Chromium did not start its DevTools server"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let targets: Value =
            serde_json::from_str(&get(&format!("127.0.0.1:{port}"), "/json/list", None))
                .expect("JSON");
        let page = targets
            .as_array()
            .and_then(|targets| targets.iter().find(|t| t["type"] == "page"))
            .and_then(|page| page["webSocketDebuggerUrl"].as_str())
            .expect("a page")
            .to_owned();
        let (socket, _) = tungstenite::connect(page.as_str()).expect("the page's DevTools socket");
        if let tungstenite::stream::MaybeTlsStream::Plain(stream) = socket.get_ref() {
            stream
                .set_read_timeout(Some(Duration::from_secs(60)))
                .expect("a read timeout");
        }
        Self {
            _process: process,
            _profile: profile,
            socket,
            next_id: 1,
        }
    }

    /// Calls `method` and waits for its answer (events in between are passed over).
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({ "id": id, "method": method, "params": params }).to_string();
        self.socket
            .send(tungstenite::Message::text(message))
            .expect("sent");
        loop {
            let answer = self.socket.read().expect("an answer from Chromium");
            let Ok(text) = answer.to_text() else {
                continue;
            };
            let value: Value = serde_json::from_str(text).expect("JSON");
            if value["id"] == id {
                assert!(value.get("error").is_none(), "{method}: {value}");
                return value["result"].clone();
            }
        }
    }

    /// The value of `expression` in the page.
    fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        result["result"]["value"].clone()
    }

    /// Waits up to 30 s until `expression` is true in the page.
    fn until(&mut self, expression: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.eval(&format!("!!({expression})")) != json!(true) {
            if Instant::now() > deadline {
                let shown = self.eval("document.body.innerText");
                panic!("{what} never showed; the page shows: {shown}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn screenshot(&mut self, path: &Path) {
        let shot = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("image data"))
            .expect("base64");
        std::fs::write(path, png).expect("the screenshot written");
    }
}

fn status(storage: &Path, name: &str) -> String {
    std::fs::read(storage.join(name).join("run.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .and_then(|record| record["status"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[test]
fn a_browser_sees_a_live_run_its_chart_and_logs_and_stops_it() {
    let Some(program) = chromium() else {
        let reason = std::env::var("TRAINYARD_CHROMIUM_SKIP").unwrap_or_default();
        assert!(
            std::env::var("CI").as_deref() != Ok("true") || !reason.is_empty(),
            "Chromium is not installed (scripts/chromium-env.sh installs it), and CI did not say why (TRAINYARD_CHROMIUM_SKIP)"
        );
        eprintln!(
            "SKIP: the dashboard's browser test: {}",
            if reason.is_empty() {
                "Chromium is not installed (scripts/chromium-env.sh)"
            } else {
                &reason
            }
        );
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let mark = "dashboard-browser";
    let script = "from trainyard import train\nimport time\nfor step in range(3000):\n    print('tick', step, flush=True)\n    train.report({'loss': 1 / (step + 1)})\n    time.sleep(0.1)\n";
    let mut run = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .args(["run", "-n", "2", "--backend", "none", "--name", "watched"])
            .arg("--storage")
            .arg(&storage)
            .env(
                "TRAINYARD_LEDGER",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ledger-{mark}")),
            )
            .env("CI", "1")
            .env(MARKER, mark)
            .args(["--", "python3", "-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("trainyard starts"),
    );
    let dashboard = Dashboard::start(env!("CARGO_BIN_EXE_trainyard"), &storage, &[(MARKER, mark)]);
    let url = dashboard.url.clone();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    // Without the token nothing is served but the bundled script and style.
    assert!(get(&dashboard.address, "/api/runs", None).contains("a token is required"));
    assert!(get(&dashboard.address, "/", None).contains("a token is required"));
    assert!(get(&dashboard.address, "/assets/uPlot.iife.min.js", None).contains("uPlot"));
    // No run name reaches outside the storage.
    assert!(
        dashboard
            .get("/api/runs/..%2F..%2Fetc")
            .contains("run name `../../etc` must be")
    );

    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&shots).expect("a folder for screenshots");
    let mut browser = Browser::start(&program);
    browser.call("Page.enable", json!({}));
    browser.call("Page.navigate", json!({ "url": url }));
    browser.until(
        "document.querySelector('#runs') && document.querySelector('#runs').innerText.includes('watched') && document.querySelector('#runs').innerText.includes('running')",
        "the run in the runs list",
    );
    browser.screenshot(&shots.join("runs.png"));

    browser.eval("document.querySelector('#runs a').click(); true");
    browser.until(
        "window.trainyard.charts.loss && window.trainyard.charts.loss.data[0].length >= 3",
        "a chart of the loss with points",
    );
    browser.until(
        "[...document.querySelectorAll('pre.log')].some((p) => p.textContent.includes('tick '))",
        "a rank's log lines",
    );
    browser.screenshot(&shots.join("run.png"));

    browser.eval("document.getElementById('stacks').click(); true");
    browser.until(
        "document.getElementById('dump').textContent.includes('=== rank 1 ===')",
        "every rank's stacks",
    );

    browser.eval("document.getElementById('stop').click(); true");
    browser.until(
        "document.getElementById('title').innerText.includes('stopped')",
        "the run stopped",
    );
    browser.screenshot(&shots.join("stopped.png"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(exited) = run.0.try_wait().expect("try_wait") {
            break exited.code();
        }
        assert!(Instant::now() < deadline, "the driver did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(130));
    assert_eq!(status(&storage, "watched"), "stopped");
    drop(dashboard);
    assert!(left_behind(mark, Duration::from_secs(10)).is_empty());

    // `show --html`: one page that draws its charts with nothing but itself.
    let page = dir.path().join("watched.html");
    let written = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["show", "watched", "--storage"])
        .arg(&storage)
        .arg("--html")
        .arg(&page)
        .output()
        .expect("trainyard show runs");
    assert!(written.status.success(), "{written:?}");
    let html = std::fs::read_to_string(&page).expect("the page");
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "nothing from outside"
    );
    browser.call(
        "Page.navigate",
        json!({ "url": format!("file://{}", page.display()) }),
    );
    browser.until(
        "window.charts && window.charts.loss && window.charts.loss.data[0].length >= 3 && document.getElementById('title').textContent === 'watched: stopped'",
        "the page's chart of the loss",
    );
    browser.screenshot(&shots.join("show.png"));
    eprintln!("screenshots: {}", shots.display());
}
