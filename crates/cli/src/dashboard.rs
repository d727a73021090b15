//! `trainyard dashboard`: a web page over a storage's runs — the runs list, and each run's
//! page with live charts of its metrics (uPlot, bundled), its attempts, each rank's latest
//! report and output, the latest stacks, and stop and stacks buttons — and the JSON API under
//! `/api/` that the page uses:
//!
//! - `GET /api/runs`: every run, newest first, as `trainyard ps --all --format json` has them;
//! - `GET /api/runs/NAME`: its record and metrics history, as `trainyard show --format json`;
//! - `GET /api/runs/NAME/logs`: the last lines of each rank of its latest attempt;
//! - `GET /api/runs/NAME/stacks`: the latest stack dump; `POST` asks for a new one;
//! - `POST /api/runs/NAME/stop`: stops it as `trainyard stop` does.
//!
//! Every request but the bundled script and style needs the token the printed URL carries
//! (`?token=`, or `Authorization: Bearer`), loopback included: another user of the machine
//! must not be able to press stop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use subtle::ConstantTimeEq as _;
use trainyard::backend::{DriverLiveness, driver_liveness};
use trainyard::checkpoint::{RunFolder, RunRecord, Storage};

use crate::Failure;
use crate::args::DashboardArgs;
use crate::assets::{CHARTS_JS, DASHBOARD_PAGE, UPLOT_CSS, UPLOT_JS};
use crate::runs::Shown;
use crate::runs::open_storage;
use crate::values::FlagError;

/// The lines of each rank a run's page shows.
const LOG_LINES: usize = 40;
/// How much of the end of each rank's file is read for them.
const LOG_BYTES: u64 = 64 * 1024;

struct Dashboard {
    storage: Storage,
    token: String,
    /// The runs a stop was asked for and is under way: a second press is no second Ctrl-C.
    stopping: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// The log folders of ended attempts of remote runs, downloaded once: a page that polls
    /// does not download them again. The newest [`KEPT_DOWNLOADS`], by run and attempt.
    downloads: std::sync::Mutex<Vec<KeptDownload>>,
}

impl Dashboard {
    /// The log folders downloaded and kept.
    fn kept_downloads(&self) -> std::sync::MutexGuard<'_, Vec<KeptDownload>> {
        self.downloads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A downloaded log folder, by run and attempt.
type KeptDownload = ((String, usize), Arc<crate::runs::logs::Source>);

/// How many downloaded log folders the dashboard keeps.
const KEPT_DOWNLOADS: usize = 8;

pub(crate) fn run(args: &DashboardArgs) -> Result<(), Failure> {
    let storage = open_storage(&args.storage)?;
    let token = token()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(Failure::other)?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .map_err(|error| {
                Failure::bad_input(FlagError::new("--port", &args.port.to_string())(
                    format!("cannot listen on {}:{}: {error}", args.host, args.port).into(),
                ))
            })?;
        let address: SocketAddr = listener.local_addr().map_err(Failure::other)?;
        let location = storage.location().to_string();
        let state = Arc::new(Dashboard {
            storage,
            token,
            stopping: std::sync::Mutex::default(),
            downloads: std::sync::Mutex::default(),
        });
        let app = routes(Arc::clone(&state));
        println!("http://{address}/?token={}", state.token);
        say!("trainyard: the dashboard of {location} (Ctrl-C ends it)");
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(Failure::other)
    })
}

fn routes(state: Arc<Dashboard>) -> Router {
    let guarded = Router::new()
        .route("/", get(page))
        .route("/api/runs", get(runs))
        .route("/api/runs/{name}", get(run_page))
        .route("/api/runs/{name}/logs", get(logs))
        .route(
            "/api/runs/{name}/stacks",
            get(latest_stacks).post(new_stacks),
        )
        .route("/api/runs/{name}/stop", post(stop))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            authorize,
        ))
        .with_state(state);
    Router::new()
        .route("/assets/uPlot.iife.min.js", get(script))
        .route("/assets/uPlot.min.css", get(style))
        .route("/assets/charts.js", get(charts))
        .merge(guarded)
}

/// 32 random hex digits.
fn token() -> Result<String, Failure> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|error| {
        Failure::other(format!(
            "the operating system gives no randomness for the dashboard's token: {error}"
        ))
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Lets a request through only with the token: `?token=` or `Authorization: Bearer`.
async fn authorize(State(state): State<Arc<Dashboard>>, request: Request, next: Next) -> Response {
    let from_query = request.uri().query().and_then(|query| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix("token="))
            .map(str::to_owned)
    });
    let from_header = bearer(request.headers());
    let given = from_header.or(from_query).unwrap_or_default();
    if bool::from(given.as_bytes().ct_eq(state.token.as_bytes())) {
        next.run(request).await
    } else {
        refused(
            StatusCode::UNAUTHORIZED,
            "a token is required: open the URL `trainyard dashboard` printed",
        )
    }
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    value.strip_prefix("Bearer ").map(str::to_owned)
}

fn refused(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

fn failed(failure: &Failure) -> Response {
    refused(StatusCode::CONFLICT, &failure.message())
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        DASHBOARD_PAGE,
    )
        .into_response()
}

async fn script() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript")], UPLOT_JS).into_response()
}

async fn charts() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript")], CHARTS_JS).into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css")], UPLOT_CSS).into_response()
}

async fn runs(State(state): State<Arc<Dashboard>>) -> Response {
    match crate::ps::list(&state.storage, true).await {
        Ok(listed) => axum::Json(serde_json::json!({
            "runs": listed.rows,
            "total": listed.total,
            "unreadable": listed.unreadable.map(|(count, first)| {
                serde_json::json!({ "count": count, "first": first })
            }),
        }))
        .into_response(),
        Err(failure) => failed(&failure),
    }
}

/// Run `name`'s folder and record; a response saying there is none otherwise.
async fn find(state: &Dashboard, name: &str) -> Result<(RunFolder, RunRecord), Response> {
    if let Err(error) = trainyard_config::check_run_name(name) {
        return Err(refused(StatusCode::BAD_REQUEST, &error.to_string()));
    }
    let folder = state.storage.run(name);
    match folder.load().await {
        Ok(Some(record)) => Ok((folder, record)),
        Ok(None) => Err(refused(
            StatusCode::NOT_FOUND,
            &format!("no run named `{name}` in {}", state.storage.location()),
        )),
        Err(error) => Err(refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            &error.to_string(),
        )),
    }
}

async fn run_page(State(state): State<Arc<Dashboard>>, Path(name): Path<String>) -> Response {
    let (folder, record) = match find(&state, &name).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    match Shown::read(&folder, record).await {
        Ok(shown) => axum::Json(shown).into_response(),
        Err(failure) => failed(&failure),
    }
}

async fn logs(State(state): State<Arc<Dashboard>>, Path(name): Path<String>) -> Response {
    let (folder, record) = match find(&state, &name).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let Some(attempt) = record.attempts.len().checked_sub(1) else {
        return axum::Json(serde_json::json!({ "attempt": null, "ranks": {} })).into_response();
    };
    let ended = record.attempts[attempt].ended_at.is_some();
    let ranks = match logs_of(&state, &folder, &record, attempt, ended).await {
        Ok(Some(source)) => tokio::task::spawn_blocking(move || {
            crate::runs::logs::tails(&source.dir, LOG_LINES, LOG_BYTES)
        })
        .await
        .unwrap_or_default(),
        Ok(None) => BTreeMap::new(),
        Err(failure) => return failed(&failure),
    };
    axum::Json(serde_json::json!({ "attempt": attempt, "ranks": ranks })).into_response()
}

/// Attempt `attempt`'s log folder: one downloaded earlier when the attempt had `ended` (its
/// copy in remote storage is final), else found (downloaded) now.
async fn logs_of(
    state: &Dashboard,
    folder: &RunFolder,
    record: &RunRecord,
    attempt: usize,
    ended: bool,
) -> Result<Option<Arc<crate::runs::logs::Source>>, Failure> {
    let key = (record.name.clone(), attempt);
    if ended {
        if let Some((_, source)) = state.kept_downloads().iter().find(|(k, _)| *k == key) {
            return Ok(Some(Arc::clone(source)));
        }
    }
    let Some(source) = crate::runs::logs::locate_async(folder, record, attempt).await? else {
        return Ok(None);
    };
    let source = Arc::new(source);
    if ended && source.is_download() {
        let mut downloads = state.kept_downloads();
        downloads.retain(|(k, _)| *k != key);
        downloads.push((key, Arc::clone(&source)));
        let over = downloads.len().saturating_sub(KEPT_DOWNLOADS);
        downloads.drain(..over);
    }
    Ok(Some(source))
}

async fn latest_stacks(State(state): State<Arc<Dashboard>>, Path(name): Path<String>) -> Response {
    let (_, record) = match find(&state, &name).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let latest = record
        .attempts
        .iter()
        .rev()
        .filter_map(|attempt| attempt.log_dir.as_deref())
        .find_map(|dir| {
            let dir = std::path::Path::new(dir);
            let newest = crate::runs::logs::stack_dumps(dir).into_keys().max()?;
            Some(dir.join(newest))
        });
    let (file, text) = match latest {
        Some(file) => {
            let text = crate::runs::logs::read_dump(&file);
            (Some(file.display().to_string()), text)
        }
        None => (None, None),
    };
    axum::Json(serde_json::json!({ "file": file, "text": text })).into_response()
}

async fn new_stacks(State(state): State<Arc<Dashboard>>, Path(name): Path<String>) -> Response {
    let (folder, record) = match find(&state, &name).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    match crate::stacks::capture(&folder, &record).await {
        Ok((file, text)) => {
            axum::Json(serde_json::json!({ "file": file.display().to_string(), "text": text }))
                .into_response()
        }
        Err(failure) => failed(&failure),
    }
}

async fn stop(State(state): State<Arc<Dashboard>>, Path(name): Path<String>) -> Response {
    let (folder, record) = match find(&state, &name).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let liveness = driver_liveness(&record);
    let through_slurm = liveness == DriverLiveness::Unknown
        && record
            .driver
            .as_ref()
            .is_some_and(|driver| driver.slurm_job.is_some());
    if liveness != DriverLiveness::Alive && !through_slurm {
        let why = match &record.driver {
            Some(driver) if liveness == DriverLiveness::Unknown => format!(
                "run `{name}` is driven on host {} (pid {}): stop it there",
                driver.host, driver.pid
            ),
            _ => format!("run `{name}` is not running"),
        };
        return refused(StatusCode::CONFLICT, &why);
    }
    let first = state
        .stopping
        .lock()
        .is_ok_and(|mut stopping| stopping.insert(name.clone()));
    if first {
        // The stop goes on after the answer: the driver gets its patience.
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            stop_run(&folder, record, &name).await;
            if let Ok(mut stopping) = state.stopping.lock() {
                stopping.remove(&name);
            }
        });
    }
    (
        StatusCode::ACCEPTED,
        axum::Json(serde_json::json!({ "stopping": true })),
    )
        .into_response()
}

/// Stops run `name` as `trainyard stop` does, saying how it went on stderr.
async fn stop_run(folder: &RunFolder, record: RunRecord, name: &str) {
    {
        match crate::stop::stop(folder, record, false).await {
            Ok(stopped) => say!("{}", crate::inert(&stopped.message)),
            Err(failure) => say!(
                "trainyard: the dashboard's stop of run `{name}` failed: {}",
                failure.message()
            ),
        }
    }
}
