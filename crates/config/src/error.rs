use std::path::PathBuf;

use trainyard_resources::{ResourceError, Resources};

/// Why a configuration is not acceptable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `num_workers` is outside `1..=MAX_WORKERS`.
    #[error("`num_workers` must be between 1 and {max}, got {0}", max = crate::MAX_WORKERS)]
    NumWorkersOutOfRange(i64),
    /// An elastic `num_workers` range whose minimum is above its maximum.
    #[error(
        "`num_workers` range {min}:{max} has its minimum above its maximum: write MIN:MAX with MIN <= MAX"
    )]
    NumWorkersRange {
        /// The minimum given.
        min: u32,
        /// The maximum given.
        max: u32,
    },
    /// `num_workers` text that is neither a number nor a range.
    #[error(
        "`num_workers` must be a number of workers or a range MIN:MAX (such as 4 or 2:8), got `{0}`"
    )]
    NumWorkersText(String),
    /// A resize interval that is not a positive duration.
    #[error(
        "resize interval `{0}` must be a positive duration such as 2s, 1m or 500ms, or a number of seconds"
    )]
    ResizeInterval(String),
    /// `GPU` requested without `use_gpu`.
    #[error(
        "`use_gpu` is false but `GPU` is {amount} in `resources_per_worker`: set `use_gpu` to true or remove `GPU` from `resources_per_worker`"
    )]
    GpuWithoutUseGpu {
        /// The GPU amount found.
        amount: String,
    },
    /// `use_gpu` with an explicit zero GPU.
    #[error(
        "`use_gpu` is true but `GPU` is 0 in `resources_per_worker`: set `use_gpu` to false or request a positive number of `GPU`"
    )]
    UseGpuWithZeroGpu,
    /// The worker bundle has nothing in it after normalisation.
    #[error(
        "a worker must request at least one resource: `resources_per_worker` {given} normalises to an empty dictionary"
    )]
    EmptyWorker {
        /// The dictionary given, as `{K=V,...}`.
        given: String,
    },
    /// `accelerator_type` is an empty string.
    #[error("`accelerator_type` must not be empty")]
    EmptyAcceleratorType,
    /// A resource dictionary in field `field` is not acceptable.
    #[error("invalid `{field}`")]
    Resources {
        /// The field holding the dictionary.
        field: &'static str,
        /// What is wrong.
        #[source]
        source: ResourceError,
    },
    /// `max_failures` below -1.
    #[error("`max_failures` must be -1 (unlimited) or a number of restarts of at least 0, got {0}")]
    MaxFailures(i64),
    /// An environment variable name that cannot be set.
    #[error(
        "environment variable name `{0}` must be non-empty and contain neither `=` nor a NUL byte"
    )]
    EnvName(String),
    /// A run name that cannot be a folder's name.
    #[error(
        "run name `{0}` must be 1 to 200 characters of letters, digits, `-`, `_` and `.` (not `.` or `..`)"
    )]
    RunName(String),
    /// `num_to_keep` of 0.
    #[error("checkpoints to keep must be at least 1, got {0}")]
    NumToKeep(u32),
    /// An empty score attribute.
    #[error("checkpoint score attribute must be a metric's name, got `{0}`")]
    ScoreAttribute(String),
    /// A score order other than `min` or `max`.
    #[error("checkpoint score order must be `min` or `max`, got `{0}`")]
    ScoreOrder(String),
    /// A resume policy other than `auto`, `always` or `never`.
    #[error("resume must be `auto`, `always` or `never`, got `{0}`")]
    Resume(String),
    /// A hang timeout that is not a positive duration.
    #[error("hang timeout must be a positive duration such as `90s`, `10m` or `1h30m`, got `{0}`")]
    HangTimeout(String),
    /// A progress source other than `reports` or `output`.
    #[error("progress must be `reports` or `output`, got `{0}`")]
    Progress(String),
    /// A configuration file that cannot be read.
    #[error("cannot read config file `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the file system reported.
        #[source]
        source: std::io::Error,
    },
    /// A configuration text that does not parse.
    #[error("invalid {format} config{}: {reason}", origin.as_ref().map(|p| format!(" `{}`", p.display())).unwrap_or_default())]
    Parse {
        /// `TOML` or `JSON`.
        format: &'static str,
        /// The file, when the text came from one.
        origin: Option<PathBuf>,
        /// The parser's explanation (it names unknown fields and lists the valid ones).
        reason: String,
    },
}

impl ConfigError {
    pub(crate) fn resources(field: &'static str) -> impl FnOnce(ResourceError) -> Self {
        move |source| Self::Resources { field, source }
    }

    pub(crate) fn empty_worker(given: &Resources) -> Self {
        Self::EmptyWorker {
            given: format!("{{{given}}}"),
        }
    }
}
