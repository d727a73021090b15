//! A `trainyard dashboard` started for a test or a benchmark, and plain HTTP GETs on loopback.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A child process killed (and reaped) when this goes out of scope, however the test ends.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `trainyard dashboard --port 0` over a storage, and the URL it printed.
#[derive(Debug)]
pub struct Dashboard {
    _process: KillOnDrop,
    /// `http://127.0.0.1:PORT/?token=TOKEN`.
    pub url: String,
    /// `127.0.0.1:PORT`.
    pub address: String,
    pub token: String,
}

impl Dashboard {
    /// Starts `trainyard` (the binary at `program`) as the dashboard of `storage`, with
    /// `env` added to its environment, and reads the URL it prints.
    ///
    /// # Panics
    /// When it cannot be started or prints no URL.
    pub fn start(program: &str, storage: &Path, env: &[(&str, &str)]) -> Self {
        let mut process = KillOnDrop(
            Command::new(program)
                .args(["dashboard", "--port", "0", "--storage"])
                .arg(storage)
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("the dashboard starts"),
        );
        let mut url = String::new();
        BufReader::new(process.0.stdout.take().expect("stdout"))
            .read_line(&mut url)
            .expect("the dashboard's URL");
        let url = url.trim().to_owned();
        let (address, token) = url
            .strip_prefix("http://")
            .and_then(|rest| rest.split_once("/?token="))
            .map(|(address, token)| (address.to_owned(), token.to_owned()))
            .unwrap_or_else(|| panic!("not http://ADDRESS/?token=TOKEN: {url}"));
        Self {
            _process: process,
            url,
            address,
            token,
        }
    }

    /// The body of `GET path` with the token.
    pub fn get(&self, path: &str) -> String {
        get(&self.address, path, Some(&self.token))
    }
}

/// The body of `GET path` at `address` (with `Authorization: Bearer TOKEN` when given): as
/// long as its `Content-Length` says, else to the connection's end.
///
/// # Panics
/// When the server cannot be reached or answers nothing within 30 s.
pub fn get(address: &str, path: &str, token: Option<&str>) -> String {
    let mut stream = TcpStream::connect(address).expect("connected");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a read timeout");
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Connection: close\r\n\r\n"
    )
    .expect("sent");
    let mut reader = BufReader::new(stream);
    let mut length = None;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("a header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<usize>().ok();
            }
        }
    }
    let mut body = Vec::new();
    match length {
        Some(length) => {
            body.resize(length, 0);
            reader.read_exact(&mut body).expect("the body");
        }
        None => {
            reader.read_to_end(&mut body).expect("the body");
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}
