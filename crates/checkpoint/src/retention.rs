//! Which committed checkpoints to keep, as Ray Train's `CheckpointConfig` decides.

use trainyard_config::{CheckpointConfig, ScoreOrder};

use crate::CheckpointRecord;

/// The indices of the checkpoints of `kept` (oldest first, as [`crate::RunRecord`] keeps
/// them) that `config` deletes: beyond `num_to_keep`, the worst by the score attribute (the
/// oldest when there is none) go; a checkpoint whose metrics lack the attribute ranks worst.
/// The latest checkpoint (`latest`) is never deleted.
#[must_use]
pub fn retention(
    kept: &[CheckpointRecord],
    latest: Option<u64>,
    config: &CheckpointConfig,
) -> Vec<u64> {
    let Some(keep) = config.num_to_keep else {
        return Vec::new();
    };
    let keep = keep as usize;
    let mut ranked: Vec<&CheckpointRecord> = kept.iter().collect();
    match &config.checkpoint_score_attribute {
        // Newest first.
        None => ranked.sort_by_key(|c| std::cmp::Reverse(c.index)),
        Some(attribute) => {
            let score =
                |c: &CheckpointRecord| c.metrics.get(attribute).and_then(serde_json::Value::as_f64);
            ranked.sort_by(|a, b| {
                let (a_score, b_score) = (score(a), score(b));
                let better = match (a_score, b_score) {
                    (Some(x), Some(y)) => match config.checkpoint_score_order {
                        ScoreOrder::Max => y.total_cmp(&x),
                        ScoreOrder::Min => x.total_cmp(&y),
                    },
                    (Some(_), None) => std::cmp::Ordering::Less,
                    (None, Some(_)) => std::cmp::Ordering::Greater,
                    (None, None) => std::cmp::Ordering::Equal,
                };
                // Ties go to the newer checkpoint.
                better.then(b.index.cmp(&a.index))
            });
        }
    }
    let mut deleted: Vec<u64> = ranked
        .into_iter()
        .skip(keep)
        .map(|c| c.index)
        .filter(|index| Some(*index) != latest)
        .collect();
    deleted.sort_unstable();
    deleted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(index: u64, loss: Option<f64>) -> CheckpointRecord {
        let mut metrics = serde_json::Map::new();
        if let Some(loss) = loss {
            metrics.insert("loss".into(), loss.into());
        }
        CheckpointRecord {
            index,
            dir: crate::checkpoint_dir_name(index),
            metrics,
            files: vec![],
            bytes: 0,
            committed_at: 0.0,
        }
    }

    #[test]
    fn without_a_score_the_newest_are_kept() {
        let kept: Vec<_> = (1..=5).map(|i| record(i, None)).collect();
        let config = CheckpointConfig::default().num_to_keep(2);
        assert_eq!(retention(&kept, Some(5), &config), vec![1, 2, 3]);
    }

    #[test]
    fn with_a_score_the_best_two_and_the_latest_are_kept() {
        let losses = [0.5, 0.1, 0.9, 0.2, 0.7];
        let kept: Vec<_> = losses
            .iter()
            .enumerate()
            .map(|(i, l)| record(i as u64 + 1, Some(*l)))
            .collect();
        let config = CheckpointConfig::default()
            .num_to_keep(2)
            .score("loss", ScoreOrder::Min);
        // Best: 2 (0.1) and 4 (0.2); 5 is the latest.
        assert_eq!(retention(&kept, Some(5), &config), vec![1, 3]);
        let max = CheckpointConfig::default()
            .num_to_keep(2)
            .score("loss", ScoreOrder::Max);
        // Best: 3 (0.9) and 5 (0.7, also the latest).
        assert_eq!(retention(&kept, Some(5), &max), vec![1, 2, 4]);
    }

    #[test]
    fn a_missing_score_ranks_worst_and_no_limit_keeps_all() {
        let kept = vec![record(1, None), record(2, Some(1.0)), record(3, Some(2.0))];
        let config = CheckpointConfig::default()
            .num_to_keep(1)
            .score("loss", ScoreOrder::Min);
        assert_eq!(retention(&kept, Some(3), &config), vec![1]);
        assert!(retention(&kept, Some(3), &CheckpointConfig::default()).is_empty());
    }
}
