//! Which committed checkpoints are best and which to keep, as Ray Train's
//! `CheckpointConfig` decides.

use std::cmp::Ordering;

use trainyard_config::{CheckpointConfig, ScoreOrder};

use crate::{CheckpointRecord, CheckpointScore};

/// The value `key` names in a report's `metrics`, as Ray Train looks up a checkpoint's score
/// in its flattened metrics: `val/loss` names `loss` in the object `val` (at any depth, and
/// `val` may itself hold a `/`), or else a metric called `val/loss`; the nested one wins, as
/// a flattened key replaces a plain one of the same name in Ray. An object is not a value.
///
/// ```
/// use trainyard_checkpoint::metric;
///
/// let metrics = serde_json::json!({"val": {"loss": 0.5}, "a/b": {"c": 1}, "step": 3});
/// let metrics = metrics.as_object().expect("an object");
/// assert_eq!(metric(metrics, "val/loss"), Some(&serde_json::json!(0.5)));
/// assert_eq!(metric(metrics, "a/b/c"), Some(&serde_json::json!(1)));
/// assert_eq!(metric(metrics, "step"), Some(&serde_json::json!(3)));
/// assert_eq!(metric(metrics, "val"), None);
/// ```
#[must_use]
pub fn metric<'a>(
    metrics: &'a serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Option<&'a serde_json::Value> {
    let nested = key
        .match_indices('/')
        .find_map(|(at, _)| match metrics.get(&key[..at]) {
            Some(serde_json::Value::Object(inner)) => metric(inner, &key[at + 1..]),
            _ => None,
        });
    nested.or_else(|| metrics.get(key).filter(|value| !value.is_object()))
}

/// `checkpoints` best first by `score`: by its attribute's value ([`metric`]) in its order,
/// those whose metrics lack a number there last; ties, and every checkpoint when there is no
/// score, newest first. [`retention`] keeps the first ones; a run's
/// [`RunRecord::best`](crate::RunRecord::best) lists them so.
#[must_use]
pub fn ranked<'a>(
    checkpoints: &'a [CheckpointRecord],
    score: Option<&CheckpointScore>,
) -> Vec<&'a CheckpointRecord> {
    let value = |c: &CheckpointRecord| {
        score.and_then(|score| metric(&c.metrics, &score.attribute)?.as_f64())
    };
    let mut ranked: Vec<(Option<f64>, &CheckpointRecord)> =
        checkpoints.iter().map(|c| (value(c), c)).collect();
    let order = score.map_or(ScoreOrder::Max, |score| score.order);
    ranked.sort_by(|(a_score, a), (b_score, b)| {
        let better = match (a_score, b_score) {
            (Some(x), Some(y)) => match order {
                ScoreOrder::Max => y.total_cmp(x),
                ScoreOrder::Min => x.total_cmp(y),
            },
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        };
        better.then(b.index.cmp(&a.index))
    });
    ranked.into_iter().map(|(_, c)| c).collect()
}

/// The indices of the checkpoints of `kept` (oldest first, as [`crate::RunRecord`] keeps
/// them) that `config` deletes: beyond `num_to_keep`, the worst as [`ranked`] orders them by
/// the config's score go (the oldest when there is none). The latest checkpoint (`latest`)
/// is never deleted.
#[must_use]
pub fn retention(
    kept: &[CheckpointRecord],
    latest: Option<u64>,
    config: &CheckpointConfig,
) -> Vec<u64> {
    let Some(keep) = config.num_to_keep else {
        return Vec::new();
    };
    let score = CheckpointScore::of(config);
    let mut deleted: Vec<u64> = ranked(kept, score.as_ref())
        .into_iter()
        .skip(keep as usize)
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
            attempt: 0,
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

    fn nested(index: u64, loss: f64) -> CheckpointRecord {
        let mut checkpoint = record(index, None);
        checkpoint.metrics = serde_json::json!({"val": {"loss": loss}, "train/loss": -loss})
            .as_object()
            .cloned()
            .expect("an object");
        checkpoint
    }

    #[test]
    fn a_nested_score_is_found_by_its_path_as_ray_flattens_it() {
        let kept: Vec<_> = [0.5, 0.1, 0.9, 0.2]
            .iter()
            .enumerate()
            .map(|(i, loss)| nested(i as u64 + 1, *loss))
            .collect();
        let config = CheckpointConfig::default()
            .num_to_keep(2)
            .score("val/loss", ScoreOrder::Min);
        // Best: 2 (0.1) and 4 (0.2, also the latest).
        assert_eq!(retention(&kept, Some(4), &config), vec![1, 3]);
        // A key holding a `/` itself is found too.
        let config = config.score("train/loss", ScoreOrder::Max);
        assert_eq!(retention(&kept, Some(4), &config), vec![1, 3]);
        let score = CheckpointScore::of(&config);
        let order: Vec<u64> = ranked(&kept, score.as_ref())
            .iter()
            .map(|c| c.index)
            .collect();
        assert_eq!(order, [2, 4, 1, 3]);
    }

    #[test]
    fn a_nested_value_wins_over_a_plain_key_of_the_same_name_and_objects_are_no_score() {
        let metrics = serde_json::json!({"val/loss": 1, "val": {"loss": 2}, "obj": {}});
        let metrics = metrics.as_object().expect("an object");
        assert_eq!(metric(metrics, "val/loss"), Some(&serde_json::json!(2)));
        assert_eq!(metric(metrics, "obj"), None);
        assert_eq!(metric(metrics, "val/loss/x"), None);
        assert_eq!(metric(metrics, "missing/loss"), None);
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
