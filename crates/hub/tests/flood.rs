//! A flood of connections that are not agents (each sends part of a frame and hangs up) is
//! told in a few lines that count them, not in one line per connection.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use trainyard_hub::{AgentHub, HubConfig};

/// How many connections the flood makes.
const FLOOD: u64 = 300;
/// The bound of the wait for every drop to be told.
const LIMIT: Duration = Duration::from_secs(60);

/// Every line the hub logs, kept.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn warnings(&self) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned();
        text.lines()
            .filter(|line| line.contains("WARN"))
            .map(str::to_owned)
            .collect()
    }
}

/// How many drops `warnings` tell of: one for a line about one connection, the count of a
/// line about many.
fn told(warnings: &[String]) -> u64 {
    warnings
        .iter()
        .map(|line| {
            if line.contains("dropped a connection that is not a waiting agent") {
                1
            } else if let Some((_, rest)) = line.split_once("dropped ") {
                rest.split_whitespace()
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            } else {
                0
            }
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_connections_that_are_not_agents_is_counted_not_told_one_by_one() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    let hub = AgentHub::start(HubConfig::new("flood"), |_, _| {})
        .await
        .expect("a hub");
    let started = Instant::now();
    for _ in 0..FLOOD {
        let mut stream = TcpStream::connect(hub.driver_address())
            .await
            .expect("the hub accepts");
        // A frame's length that promises more than follows, then the end.
        stream
            .write_all(&[0, 0, 0, 64, 1, 2, 3])
            .await
            .expect("sent");
        stream.shutdown().await.expect("shut");
    }
    let flooded = started.elapsed();
    let deadline = Instant::now() + LIMIT;
    while told(&captured.warnings()) < FLOOD {
        assert!(
            Instant::now() < deadline,
            "not every drop was told within {LIMIT:?}: {:#?}",
            captured.warnings()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let warnings = captured.warnings();
    assert_eq!(told(&warnings), FLOOD, "{warnings:#?}");
    // The first drop on a line of its own, then one line per window of the flood (and one
    // for the window in which it ended).
    let windows = flooded.as_secs() / 5 + 2;
    assert!(
        warnings.len() as u64 <= 1 + windows,
        "{} lines for a flood of {flooded:?}: {warnings:#?}",
        warnings.len()
    );
    assert!(
        warnings[1].contains("connections in ") && warnings[1].contains("s that were not agents"),
        "{warnings:#?}"
    );
    hub.shutdown().await;
}
