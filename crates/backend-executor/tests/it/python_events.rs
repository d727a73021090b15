//! The event stream's contract seen from both sides: the Python package's
//! `python/trainyard/_events.py` lists the same event kinds, in the same order, and the same
//! version as [`RunEvent::KINDS`] and [`RUN_EVENTS_VERSION`], so that a new or renamed event
//! is a change of both sides (the Python tests check that the Python driver handles every
//! kind it lists).

use std::path::Path;

use trainyard_backend_executor::{RUN_EVENTS_VERSION, RunEvent};

/// The text of the Python side of the contract.
fn python_contract() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/trainyard/_events.py");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The value of `NAME = <value>` at the start of a line.
fn assigned<'a>(text: &'a str, name: &str) -> &'a str {
    let prefix = format!("{name} = ");
    text.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("_events.py assigns no {name}"))
}

/// The strings of the tuple `NAME: ... = (...)`.
fn listed(text: &str, name: &str) -> Vec<String> {
    let start = text
        .find(&format!("\n{name}:"))
        .or_else(|| text.find(&format!("\n{name} =")))
        .unwrap_or_else(|| panic!("_events.py defines no {name}"));
    let body = &text[start..];
    let open = body.find('(').expect("a tuple");
    let close = body.find(')').expect("a closed tuple");
    body[open + 1..close]
        .split(',')
        .map(|item| item.trim().trim_matches('"').to_owned())
        .filter(|item| !item.is_empty())
        .collect()
}

#[test]
fn the_python_driver_reads_the_kinds_and_the_version_the_stream_writes() {
    let text = python_contract();
    assert_eq!(
        assigned(&text, "VERSION").trim().parse::<u32>().ok(),
        Some(RUN_EVENTS_VERSION),
        "python/trainyard/_events.py VERSION"
    );
    assert_eq!(
        listed(&text, "KINDS"),
        RunEvent::KINDS.to_vec(),
        "python/trainyard/_events.py KINDS"
    );
    let ends: Vec<String> = listed(&text, "ENDS");
    let ours: Vec<&str> = RunEvent::KINDS
        .iter()
        .copied()
        .filter(|kind| kind.starts_with("run_") && *kind != "run_started")
        .collect();
    assert_eq!(ends, ours, "python/trainyard/_events.py ENDS");
}
