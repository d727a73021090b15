//! Test support (the `testing` feature): [`S3Server`], a real S3 API server on a loopback
//! port, for tests of S3 storage in this crate and the crates above it, and [`conformance`],
//! the behaviour checks every kind of storage passes.
//!
//! The server is moto's (`pip install "moto[server]"`; `scripts/s3-env.sh` installs it into
//! the project's Python environment and prints its path). It keeps everything in memory,
//! accepts any credentials, and speaks enough of S3 for [`object_store`]: single and
//! multipart uploads, listing, ranged reads, bulk deletes.
#![allow(
    clippy::disallowed_methods,
    reason = "helpers for tests: they make scratch files of their own"
)]

pub mod conformance;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `TRAINYARD_MOTO_SERVER`: the path of `moto_server` (what `scripts/s3-env.sh` prints).
pub const MOTO_SERVER: &str = "TRAINYARD_MOTO_SERVER";
/// `TRAINYARD_S3_SKIP`: why the S3 tests skip, when CI knows and has said so loudly (the
/// package registry could not be reached to install moto); without it, a missing
/// `moto_server` under `CI=true` is an error.
pub const S3_SKIP: &str = "TRAINYARD_S3_SKIP";

/// How long the server may take to answer after it starts.
const READY_WITHIN: Duration = Duration::from_secs(15);

/// How many free ports are tried (another process may take one before the server binds it).
const TRIES: usize = 3;

/// The S3 server cannot be found, started or asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum S3ServerError {
    /// `moto_server` is not installed where it is looked for, and `CI=true`.
    #[error(
        "moto_server, the S3 API server of the S3 tests, is not installed: {reason}; run `scripts/s3-env.sh` and set TRAINYARD_MOTO_SERVER to the path it prints"
    )]
    NotInstalled {
        /// Where it was looked for.
        reason: String,
    },
    /// The server's process cannot be started.
    #[error("cannot start `{program}`")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server exited before it answered.
    #[error(
        "`{program}` exited ({status}) before it answered on {endpoint}; its output ends with: {output}"
    )]
    Exited {
        /// The program.
        program: PathBuf,
        /// Where it was to answer.
        endpoint: String,
        /// How it exited.
        status: String,
        /// The end of its output.
        output: String,
    },
    /// The server did not answer in time.
    #[error("`{program}` did not answer on {endpoint} within {} s; its output ends with: {output}", waited.as_secs())]
    NotReady {
        /// The program.
        program: PathBuf,
        /// Where it was to answer.
        endpoint: String,
        /// How long it was waited for.
        waited: Duration,
        /// The end of its output.
        output: String,
    },
    /// A request to the server failed.
    #[error("cannot reach the S3 server at {endpoint}")]
    Request {
        /// The server.
        endpoint: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server refused to create a bucket.
    #[error("the S3 server at {endpoint} refused to create bucket `{bucket}`: {response}")]
    BucketRefused {
        /// The server.
        endpoint: String,
        /// The bucket.
        bucket: String,
        /// Its response's status line and body.
        response: String,
    },
}

/// An S3 API server (moto) on a free loopback port, in its own process group, killed with
/// it when dropped.
///
/// ```no_run
/// use trainyard_checkpoint::testing::S3Server;
/// use trainyard_checkpoint::{RunFolder, StorageLocation};
///
/// # async fn test() -> Result<(), Box<dyn std::error::Error>> {
/// // `None` (after a `SKIP:` line) when moto is not installed, unless CI=true.
/// let Some(server) = S3Server::start()? else { return Ok(()) };
/// server.create_bucket("runs")?;
/// let folder = RunFolder::open_uri("s3://runs/prefix/my-run", &server.env())?;
/// assert!(folder.load().await?.is_none());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    port: u16,
    program: PathBuf,
    log: PathBuf,
}

impl S3Server {
    /// Starts the server and waits until it answers (at most 15 s). It is looked for at
    /// `$TRAINYARD_MOTO_SERVER`, then beside `$TRAINYARD_TORCH_PYTHON` (the project's venv),
    /// then on `PATH`. When it is not found: `Ok(None)` after a `SKIP:` line on stderr, so
    /// the caller's test can return early — unless `CI=true`, where a missing environment
    /// is an error (but for a skip CI has announced: [`S3_SKIP`]).
    ///
    /// # Errors
    /// [`S3ServerError`]: not installed (under CI), or it cannot be started.
    pub fn start() -> Result<Option<Self>, S3ServerError> {
        let program = match find() {
            Ok(program) => program,
            Err(reason) => {
                let known = std::env::var(S3_SKIP).ok().filter(|why| !why.is_empty());
                if known.is_none() && std::env::var("CI").is_ok_and(|ci| ci == "true") {
                    return Err(S3ServerError::NotInstalled { reason });
                }
                let why = known.unwrap_or(reason);
                eprintln!("SKIP: S3 tests need moto_server: {why} (run scripts/s3-env.sh)");
                return Ok(None);
            }
        };
        let mut tries = 0;
        loop {
            tries += 1;
            let port = free_port().map_err(|source| S3ServerError::Request {
                endpoint: "127.0.0.1".to_owned(),
                source,
            })?;
            match Self::start_on(&program, port) {
                Ok(server) => return Ok(Some(server)),
                // Most likely the port was taken meanwhile.
                Err(S3ServerError::Exited { .. }) if tries < TRIES => {}
                Err(error) => return Err(error),
            }
        }
    }

    fn start_on(program: &Path, port: u16) -> Result<Self, S3ServerError> {
        let spawn_failed = |source| S3ServerError::Spawn {
            program: program.to_path_buf(),
            source,
        };
        let log =
            std::env::temp_dir().join(format!("trainyard-moto-{}-{port}.log", std::process::id()));
        let out = std::fs::File::create(&log).map_err(spawn_failed)?;
        let err = out.try_clone().map_err(spawn_failed)?;
        let child = Command::new(program)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(spawn_failed)?;
        // From here on, dropping `server` kills the process.
        let mut server = Self {
            child,
            port,
            program: program.to_path_buf(),
            log,
        };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(S3ServerError::Exited {
                    program: server.program.clone(),
                    endpoint: server.endpoint(),
                    status: status.to_string(),
                    output: server.output_tail(),
                });
            }
            if server.request("GET", "/").is_ok() {
                return Ok(server);
            }
            if started.elapsed() > READY_WITHIN {
                return Err(S3ServerError::NotReady {
                    program: server.program.clone(),
                    endpoint: server.endpoint(),
                    waited: READY_WITHIN,
                    output: server.output_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `http://127.0.0.1:PORT`.
    #[must_use]
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The storage variables that reach it ([`crate::STORAGE_VARS`]): test credentials,
    /// region `us-east-1`, `AWS_ENDPOINT_URL` and `AWS_ALLOW_HTTP`.
    #[must_use]
    pub fn env(&self) -> BTreeMap<String, String> {
        [
            ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// Creates bucket `name`.
    ///
    /// # Errors
    /// [`S3ServerError::Request`], [`S3ServerError::BucketRefused`].
    pub fn create_bucket(&self, name: &str) -> Result<(), S3ServerError> {
        let response =
            self.request("PUT", &format!("/{name}"))
                .map_err(|source| S3ServerError::Request {
                    endpoint: self.endpoint(),
                    source,
                })?;
        if response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200") {
            Ok(())
        } else {
            Err(S3ServerError::BucketRefused {
                endpoint: self.endpoint(),
                bucket: name.to_owned(),
                response: response.chars().take(500).collect(),
            })
        }
    }

    /// The keys of the objects in `bucket` whose key starts with `prefix`, sorted.
    ///
    /// # Errors
    /// [`S3ServerError::Request`].
    pub fn keys(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, S3ServerError> {
        let response = self.get(&format!("/{bucket}?list-type=2&prefix={prefix}"))?;
        let mut keys = elements(&response, "Key");
        keys.sort();
        Ok(keys)
    }

    /// The keys of the multipart uploads open in `bucket` (started, neither completed nor
    /// aborted).
    ///
    /// # Errors
    /// [`S3ServerError::Request`].
    pub fn open_uploads(&self, bucket: &str) -> Result<Vec<String>, S3ServerError> {
        let response = self.get(&format!("/{bucket}?uploads"))?;
        Ok(response
            .split("<Upload>")
            .skip(1)
            .flat_map(|upload| elements(upload, "Key").into_iter().take(1))
            .collect())
    }

    fn get(&self, path: &str) -> Result<String, S3ServerError> {
        let response = self
            .request("GET", path)
            .map_err(|source| S3ServerError::Request {
                endpoint: self.endpoint(),
                source,
            })?;
        if response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200") {
            Ok(response)
        } else {
            Err(S3ServerError::Request {
                endpoint: self.endpoint(),
                source: std::io::Error::other(format!(
                    "GET {path}: {}",
                    response.chars().take(300).collect::<String>()
                )),
            })
        }
    }

    /// The server's process id (also its process group's).
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One unsigned request with an empty body (moto does not check signatures); the whole
    /// response.
    fn request(&self, method: &str, path: &str) -> std::io::Result<String> {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.set_write_timeout(Some(Duration::from_secs(5)))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        let response = String::from_utf8_lossy(&response).into_owned();
        if response.starts_with("HTTP/") {
            Ok(response)
        } else {
            Err(std::io::Error::other(format!(
                "not an HTTP response: {:?}",
                response.chars().take(100).collect::<String>()
            )))
        }
    }

    /// The last lines of the server's output.
    fn output_tail(&self) -> String {
        let output = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = output.char_indices().rev().nth(2000).map_or(0, |(i, _)| i);
        output[start..].trim().to_owned()
    }
}

/// The text of every `<name>…</name>` element of `xml`, in order.
fn elements(xml: &str, name: &str) -> Vec<String> {
    let (open, close) = (format!("<{name}>"), format!("</{name}>"));
    xml.split(open.as_str())
        .skip(1)
        .filter_map(|rest| {
            rest.split_once(close.as_str())
                .map(|(text, _)| text.to_owned())
        })
        .collect()
}

impl Drop for S3Server {
    fn drop(&mut self) {
        // The whole process group: moto and anything it started. The group cannot have been
        // reused: its leader is our child, not yet reaped.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A loopback port nothing listens on right now.
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// `moto_server`: where [`S3Server::start`] looks; why not, when it is nowhere.
fn find() -> Result<PathBuf, String> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(path) = var(MOTO_SERVER) {
        let path = PathBuf::from(path);
        return if is_executable(&path) {
            Ok(path)
        } else {
            Err(format!(
                "{MOTO_SERVER}={} is not an executable file",
                path.display()
            ))
        };
    }
    if let Some(python) = var("TRAINYARD_TORCH_PYTHON") {
        if let Some(dir) = Path::new(&python).parent() {
            let candidate = dir.join("moto_server");
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
    }
    if let Some(path) = var("PATH") {
        if let Some(found) = std::env::split_paths(&path)
            .map(|dir| dir.join("moto_server"))
            .find(|candidate| is_executable(candidate))
        {
            return Ok(found);
        }
    }
    Err(format!(
        "{MOTO_SERVER} is not set, and moto_server is neither beside TRAINYARD_TORCH_PYTHON nor on PATH"
    ))
}
