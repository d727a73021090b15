//! How a run's record reads as text: its status, times, durations and metrics.

use trainyard::checkpoint::RunStatus;

/// The status as `run.json` spells it.
pub(crate) const fn status_name(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Running => "running",
        RunStatus::Finished => "finished",
        RunStatus::Failed => "failed",
        RunStatus::Interrupted => "interrupted",
        RunStatus::Stopped => "stopped",
    }
}

/// `2026-12-03 09:15:02` (UTC).
pub(crate) fn started(seconds: f64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(seconds.max(0.0));
    humantime::format_rfc3339_seconds(at)
        .to_string()
        .replace('T', " ")
        .trim_end_matches('Z')
        .to_owned()
}

/// `0.8s`, `12m05s`, `3h02m`.
pub(crate) fn duration(seconds: f64) -> String {
    let whole = seconds as u64;
    match whole {
        0..60 => format!("{seconds:.1}s"),
        60..3600 => format!("{}m{:02}s", whole / 60, whole % 60),
        _ => format!("{}h{:02}m", whole / 3600, whole / 60 % 60),
    }
}

/// `loss=0.1235 epoch=4` (the first few metrics), [`inert`](crate::inert).
pub(crate) fn metrics(metrics: &serde_json::Map<String, serde_json::Value>) -> String {
    const SHOWN: usize = 3;
    let mut parts: Vec<String> = metrics
        .iter()
        .take(SHOWN)
        .map(|(name, value)| format!("{}={}", crate::inert(name), number(value)))
        .collect();
    if metrics.len() > SHOWN {
        parts.push("…".to_owned());
    }
    parts.join(" ")
}

/// A metric's value as the tables show it: whole numbers as they are, others to 4 places.
pub(crate) fn number(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Number(n) => n
            .as_f64()
            .filter(|v| v.fract() != 0.0)
            .map_or_else(|| n.to_string(), |v| format!("{v:.4}")),
        other => crate::inert(&other.to_string()),
    }
}
