//! Storages full of runs, as the day-two commands read them: the fixture of their benchmarks.

use std::path::Path;

/// Writes `count` finished runs into the local storage at `root` (`run-0000`, ...): each a
/// `run.json` of record version 2 with a driver, one attempt of 2 workers and three committed
/// checkpoints, and a metrics history of 20 reports.
///
/// # Panics
/// When a folder or file cannot be written.
pub fn write_runs(root: &Path, count: usize) {
    for i in 0..count {
        let name = format!("run-{i:04}");
        let dir = root.join(&name);
        std::fs::create_dir_all(&dir).expect("a run folder");
        let started = 1_790_000_000.0 + i as f64 * 60.0;
        let checkpoints: Vec<serde_json::Value> = (1..=3u64)
            .map(|index| {
                serde_json::json!({
                    "index": index,
                    "dir": format!("checkpoint_{index:06}"),
                    "metrics": {"loss": 1.0 / index as f64, "epoch": index},
                    "files": ["model.pt"],
                    "bytes": 1 << 20,
                    "committed_at": started + index as f64,
                })
            })
            .collect();
        let record = serde_json::json!({
            "version": 2,
            "name": name,
            "status": "finished",
            "driver": {
                "user": "bench", "uid": 1000, "host": "elsewhere", "pid": 1,
                "started_at": started,
            },
            "attempts": [{
                "restart_count": 0, "started_at": started, "ended_at": started + 30.0,
                "resumed_from": null, "failure": null, "world_size": 2,
            }],
            "checkpoints": checkpoints,
            "latest_checkpoint": 3,
            "last_index": 3,
        });
        std::fs::write(
            dir.join("run.json"),
            serde_json::to_vec_pretty(&record).expect("JSON"),
        )
        .expect("run.json");
        let history: String = (0..20)
            .map(|step| {
                format!(
                    "{}\n",
                    serde_json::json!({
                        "time": started + f64::from(step),
                        "attempt": 0,
                        "world_size": 2,
                        "rank": step % 2,
                        "metrics": {"loss": 1.0 / f64::from(step + 1), "step": step},
                    })
                )
            })
            .collect();
        std::fs::write(dir.join("metrics.jsonl"), history).expect("metrics.jsonl");
    }
}
