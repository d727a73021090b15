//! [`Plan`]: everything a scaling config resolves to before anything is started.

use std::fmt;

use serde::Serialize;
use trainyard_resources::{ActorOptions, Resources};

use crate::scaling::total_of;
use crate::{ConfigError, PlacementGroupFactory, ScalingConfig};

/// What a scaling config resolves to: the normalised config, the total reservation, the
/// placement group, and each worker's actor options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The configuration with both dictionaries normalised.
    pub scaling_config: ScalingConfig,
    /// Everything reserved: trainer + workers.
    pub total_resources: Resources,
    /// The bundles and the strategy.
    pub placement_group_factory: PlacementGroupFactory,
    /// One entry per worker, in bundle order.
    pub workers: Vec<WorkerPlan>,
}

/// One worker of a [`Plan`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerPlan {
    /// The bundle the worker is pinned to.
    pub bundle_index: usize,
    /// The options the worker actor is started with.
    pub actor_options: ActorOptions,
}

impl ScalingConfig {
    /// Resolves the configuration into a [`Plan`].
    ///
    /// # Errors
    /// As [`ScalingConfig::validate`].
    pub fn plan(&self) -> Result<Plan, ConfigError> {
        let worker = self.worker_resources()?;
        let trainer = self.trainer_bundle()?;
        let actor_options = ActorOptions::try_from(&worker)
            .map_err(ConfigError::resources("resources_per_worker"))?;
        let total_resources = total_of(&worker, trainer.clone(), self.num_workers.max())?;
        let placement_group_factory = self.factory_of(worker.clone(), trainer.clone())?;
        let workers = (0..placement_group_factory.bundles.len())
            .map(|bundle_index| WorkerPlan {
                bundle_index,
                actor_options: actor_options.clone(),
            })
            .collect();
        Ok(Plan {
            scaling_config: Self {
                resources_per_worker: Some(worker),
                trainer_resources: Some(trainer),
                ..self.clone()
            },
            total_resources,
            placement_group_factory,
            workers,
        })
    }
}

/// What the text rendering prints for an empty dictionary (and [`ActorOptions`]' for an
/// absent `object_store_memory`).
const NOTHING: &str = "-";

/// A dictionary as the text rendering prints it: units on byte sizes, `-` when empty.
#[derive(Debug)]
struct Dict<'a>(Option<&'a Resources>);

impl fmt::Display for Dict<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(resources) if !resources.is_empty() => write!(f, "{resources:#}"),
            _ => f.write_str(NOTHING),
        }
    }
}

/// Consecutive workers whose bundles and actor options are identical: one row of the table.
#[derive(Debug)]
struct Row<'a> {
    first: usize,
    last: usize,
    bundle: Option<&'a Resources>,
    options: &'a ActorOptions,
}

impl<'a> Row<'a> {
    /// The row as the table prints it: `1-99999`, `× 99999`, the bundle, the options.
    fn cells(&self) -> Cells<'a> {
        let range = if self.first == self.last {
            self.first.to_string()
        } else {
            format!("{}-{}", self.first, self.last)
        };
        Cells {
            range,
            count: format!("× {}", self.last - self.first + 1),
            bundle: Dict(self.bundle).to_string(),
            options: self.options,
        }
    }
}

/// The text of one row, before the columns are aligned.
#[derive(Debug)]
struct Cells<'a> {
    range: String,
    count: String,
    bundle: String,
    options: &'a ActorOptions,
}

/// The width of a column: its widest cell or its title, in characters.
fn column_width<'a>(title: &str, cells: impl Iterator<Item = &'a String>) -> usize {
    cells
        .map(|cell| cell.chars().count())
        .fold(title.chars().count(), usize::max)
}

impl Plan {
    /// The table's rows: workers in order, consecutive identical ones grouped.
    fn rows(&self) -> Vec<Row<'_>> {
        let bundles = &self.placement_group_factory.bundles;
        let mut rows: Vec<Row<'_>> = Vec::new();
        for worker in &self.workers {
            let bundle = bundles.get(worker.bundle_index);
            let options = &worker.actor_options;
            match rows.last_mut() {
                Some(row)
                    if row.last.checked_add(1) == Some(worker.bundle_index)
                        && row.bundle == bundle
                        && row.options == options =>
                {
                    row.last = worker.bundle_index;
                }
                _ => rows.push(Row {
                    first: worker.bundle_index,
                    last: worker.bundle_index,
                    bundle,
                    options,
                }),
            }
        }
        rows
    }
}

impl fmt::Display for Plan {
    /// The text `trainyard plan` prints: a summary of the normalised config, then a table
    /// of bundles, each with the resources it reserves and the options of the worker it
    /// hosts.
    ///
    /// - Consecutive bundles that are identical (same resources, same worker options)
    ///   share one row: `1-99999` in the `bundle` column and `× 99999` in `count`; a
    ///   single bundle reads `0` and `× 1`. The JSON form keeps one entry per worker.
    /// - When the trainer reserves something, a last line says that bundle 0 holds it on
    ///   top of worker 0, as it is not part of any worker's actor options.
    /// - Byte sizes carry units (`memory=10GB`). `-` stands for nothing: an empty
    ///   dictionary, or no `object_store_memory`; numbers (`num_gpus=0`, `memory=0`) are
    ///   always printed as numbers. The worker options read as [`ActorOptions`]' `Display`.
    ///
    /// No line ends in spaces, and the text does not end with a line break.
    ///
    /// ```
    /// use trainyard_config::ScalingConfig;
    ///
    /// let plan = ScalingConfig::default()
    ///     .num_workers(100_000)
    ///     .resources_per_worker("CPU=2,memory=1KB".parse()?)
    ///     .trainer_resources("CPU=1".parse()?)
    ///     .plan()?;
    /// let options = "num_cpus=2 num_gpus=0 memory=1KB object_store_memory=- resources=-";
    /// assert_eq!(
    ///     plan.to_string(),
    ///     format!(
    ///         "\
    /// workers             100000
    /// use_gpu             false
    /// placement_strategy  PACK
    /// per worker          CPU=2,memory=1KB
    /// trainer             CPU=1
    /// total               CPU=200001,memory=100MB
    ///
    /// bundle   count    bundle resources  worker actor options
    /// 0        × 1      CPU=3,memory=1KB  {options}
    /// 1-99999  × 99999  CPU=2,memory=1KB  {options}
    /// bundle 0 also reserves the trainer's CPU=1 (not part of worker 0's actor options)"
    ///     )
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.scaling_config;
        let trainer = config.trainer_resources.as_ref();
        let workers = config.num_workers;
        if workers.is_elastic() {
            writeln!(
                f,
                "workers             {workers} (elastic: starts once {} fit, grows up to {}, looks for room every {})",
                workers.min(),
                workers.max(),
                humantime::format_duration(config.resize_every())
            )?;
        } else {
            writeln!(f, "workers             {workers}")?;
        }
        writeln!(f, "use_gpu             {}", config.use_gpu)?;
        writeln!(
            f,
            "placement_strategy  {}",
            self.placement_group_factory.strategy
        )?;
        let per_worker = Dict(config.resources_per_worker.as_ref());
        writeln!(f, "per worker          {per_worker}")?;
        writeln!(f, "trainer             {}", Dict(trainer))?;
        let at_most = if workers.is_elastic() {
            format!(" (at most, with {} workers)", workers.max())
        } else {
            String::new()
        };
        writeln!(
            f,
            "total               {}{at_most}",
            Dict(Some(&self.total_resources))
        )?;
        writeln!(f)?;

        let rows: Vec<Cells<'_>> = self.rows().iter().map(Row::cells).collect();
        let (bundle, count, resources) = ("bundle", "count", "bundle resources");
        let range_width = column_width(bundle, rows.iter().map(|row| &row.range));
        let count_width = column_width(count, rows.iter().map(|row| &row.count));
        let bundle_width = column_width(resources, rows.iter().map(|row| &row.bundle));
        write!(
            f,
            "{bundle:range_width$}  {count:count_width$}  {resources:bundle_width$}  worker actor options"
        )?;
        for row in &rows {
            write!(
                f,
                "\n{:range_width$}  {:count_width$}  {:bundle_width$}  {}",
                row.range, row.count, row.bundle, row.options
            )?;
        }
        if let Some(trainer) = trainer.filter(|t| !t.is_empty()) {
            write!(
                f,
                "\nbundle 0 also reserves the trainer's {trainer:#} (not part of worker 0's actor options)"
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(config: ScalingConfig) -> Plan {
        config.plan().unwrap()
    }

    fn table(plan: &Plan) -> Vec<String> {
        plan.to_string()
            .lines()
            .skip_while(|line| !line.starts_with("bundle "))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn identical_bundles_share_one_row_with_their_range_and_count() {
        let text = table(&plan(ScalingConfig::default().num_workers(100_000)));
        assert_eq!(
            text,
            [
                "bundle   count     bundle resources  worker actor options",
                "0-99999  × 100000  CPU=1             num_cpus=1 num_gpus=0 memory=0 object_store_memory=- resources=-",
            ]
        );
    }

    #[test]
    fn a_single_worker_is_a_row_of_one() {
        let text = table(&plan(ScalingConfig::default()));
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(text[1].starts_with("0       × 1    CPU=1 "), "{text:?}");
    }

    #[test]
    fn bundles_that_differ_are_not_grouped() {
        let mut plan = plan(ScalingConfig::default().num_workers(4));
        plan.placement_group_factory.bundles[2] = "CPU=2".parse().unwrap();
        let ranges: Vec<String> = table(&plan)
            .iter()
            .skip(1)
            .map(|row| row.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(ranges, ["0-1 × 2", "2 × 1", "3 × 1"]);
    }

    #[test]
    fn the_trainer_note_appears_only_when_the_trainer_reserves_something() {
        let with = plan(
            ScalingConfig::default()
                .num_workers(3)
                .trainer_resources("CPU=1,memory=1GiB".parse().unwrap()),
        )
        .to_string();
        assert!(
            with.ends_with(
                "\nbundle 0 also reserves the trainer's CPU=1,memory=1GiB (not part of worker 0's actor options)"
            ),
            "{with}"
        );
        let without = plan(ScalingConfig::default().trainer_resources(Resources::new()));
        assert!(!without.to_string().contains("also reserves"), "{without}");
    }

    #[test]
    fn nothing_is_always_a_dash_and_no_line_ends_in_spaces() {
        let text = plan(ScalingConfig::default().num_workers(2)).to_string();
        assert!(
            text.lines().any(|line| line == "trainer             -"),
            "{text}"
        );
        assert!(!text.contains("{}"), "{text}");
        assert!(text.lines().all(|line| line == line.trim_end()), "{text}");
        assert!(!text.ends_with('\n'), "{text}");
    }
}
