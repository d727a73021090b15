//! What a test logs, read back through its test binary's one global subscriber.
//!
//! Every test that reads its logs calls [`capture`] before anything else. tracing decides
//! once per log statement whether anyone listens, and with a thread-local subscriber
//! (`set_default`) it asks only the thread that reaches the statement first: when another
//! test's thread gets there first, the statement stays off for every thread, and the test
//! that listens sees nothing. One global subscriber, installed before any test logs, listens
//! on every thread; each test reads back what was logged on its own thread, where its
//! `#[tokio::test]` runtime runs every task. So the outcome depends neither on the order of
//! the tests nor on the runner (`cargo test` runs them as threads of one process, nextest
//! one per process).

use std::cell::RefCell;
use std::sync::Once;

pub use tracing_subscriber::filter::LevelFilter;

thread_local! {
    /// What was logged on this thread since it called [`capture`].
    static LOGGED: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Writes into [`LOGGED`] of the thread that logs, when that thread captures.
struct ThisThread;

impl std::io::Write for ThisThread {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        LOGGED.with_borrow_mut(|logged| {
            if let Some(logged) = logged {
                logged.extend_from_slice(bytes);
            }
        });
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the global subscriber (`level` and above, once per process: the first call's
/// level holds for the whole test binary) and starts capturing what this thread logs.
///
/// # Panics
/// When something else in the test binary set a global subscriber.
pub fn capture(level: LevelFilter) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(|| ThisThread)
            .with_ansi(false)
            .with_max_level(level)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("nothing else in this test binary sets a subscriber");
    });
    LOGGED.with_borrow_mut(|logged| *logged = Some(Vec::new()));
}

/// What this thread logged since it called [`capture`].
///
/// # Panics
/// When what was logged is not UTF-8.
#[must_use]
pub fn captured() -> String {
    let bytes = LOGGED.with_borrow(|logged| logged.clone().unwrap_or_default());
    String::from_utf8(bytes).expect("UTF-8")
}
