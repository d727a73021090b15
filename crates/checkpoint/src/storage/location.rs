//! [`StorageLocation`]: where runs are stored, as a user writes it.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use crate::StorageError;

/// Where runs are stored, as a user writes it: a path (absolute, or relative to the current
/// directory; `~/` is the home directory), `file:///PATH`, or `s3://BUCKET[/PREFIX]`.
///
/// ```
/// use trainyard_checkpoint::StorageLocation;
///
/// let s3: StorageLocation = "s3://bucket/runs/".parse()?;
/// assert_eq!(s3.join("mnist").to_string(), "s3://bucket/runs/mnist");
/// let local: StorageLocation = "file:///mnt/nfs/runs".parse()?;
/// assert_eq!(local, StorageLocation::Local("/mnt/nfs/runs".into()));
/// assert!("gs://bucket".parse::<StorageLocation>().is_err());
/// # Ok::<(), trainyard_checkpoint::StorageError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StorageLocation {
    /// A local or shared (NFS) file system; the path is absolute.
    Local(PathBuf),
    /// An S3 bucket (or an S3 API server: `AWS_ENDPOINT_URL`), with a key prefix (no leading
    /// or trailing `/`, possibly empty).
    S3 {
        /// The bucket.
        bucket: String,
        /// The prefix.
        prefix: String,
    },
}

impl StorageLocation {
    /// `~/trainyard_results`, as Ray uses `~/ray_results` (`./trainyard_results` when `HOME`
    /// is not set).
    #[must_use]
    pub fn default_local() -> Self {
        let home = std::env::var_os("HOME")
            .filter(|home| !home.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::current_dir().ok())
            .unwrap_or_else(|| PathBuf::from("/"));
        Self::Local(home.join("trainyard_results"))
    }

    /// Whether files in it are reached through the local file system.
    #[must_use]
    pub const fn is_local(&self) -> bool {
        matches!(self, Self::Local(_))
    }

    /// The location of `name` inside it: `/a/b/name` or `s3://bucket/prefix/name`.
    #[must_use]
    pub fn join(&self, name: &str) -> Self {
        match self {
            Self::Local(path) => Self::Local(path.join(name)),
            Self::S3 { bucket, prefix } => Self::S3 {
                bucket: bucket.clone(),
                prefix: join_key(prefix, name),
            },
        }
    }

    /// The location one level up and the last segment's name: `(/a/b, name)` for
    /// `/a/b/name`; `None` for a root (`/`, `s3://bucket`).
    pub(crate) fn split_last(&self) -> Option<(Self, String)> {
        match self {
            Self::Local(path) => {
                let name = path.file_name()?.to_str()?.to_owned();
                let parent = path.parent()?.to_path_buf();
                Some((Self::Local(parent), name))
            }
            Self::S3 { bucket, prefix } => {
                if prefix.is_empty() {
                    return None;
                }
                let (parent, name) = prefix.rsplit_once('/').unwrap_or(("", prefix));
                Some((
                    Self::S3 {
                        bucket: bucket.clone(),
                        prefix: parent.to_owned(),
                    },
                    name.to_owned(),
                ))
            }
        }
    }
}

/// `prefix/name`, or `name` when the prefix is empty; empty segments are dropped.
pub(crate) fn join_key(prefix: &str, name: &str) -> String {
    prefix
        .split('/')
        .chain(name.split('/'))
        .filter(|segment| !segment.is_empty())
        .collect::<Vec<_>>()
        .join("/")
}

/// `path` relative to `base`, with `/` separators, when it is a folder below it: lexically,
/// and with no `..` in what is left.
pub(crate) fn relative_below(path: &Path, base: &Path) -> Option<String> {
    let rest = path.strip_prefix(base).ok()?;
    let mut segments = Vec::new();
    for component in rest.components() {
        match component {
            Component::Normal(segment) => segments.push(segment.to_str()?),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (!segments.is_empty()).then(|| segments.join("/"))
}

fn invalid(value: &str, reason: impl Into<String>) -> StorageError {
    StorageError::InvalidLocation {
        value: value.to_owned(),
        reason: reason.into(),
    }
}

/// `s3://` has been stripped: `bucket[/prefix]`.
fn parse_s3(value: &str, rest: &str) -> Result<StorageLocation, StorageError> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(invalid(value, "no bucket is named"));
    }
    if let Some(bad) = bucket
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return Err(invalid(
            value,
            format!(
                "the bucket name `{bucket}` holds `{bad}`; a bucket name is letters, digits, `.`, `-` and `_`"
            ),
        ));
    }
    Ok(StorageLocation::S3 {
        bucket: bucket.to_owned(),
        prefix: join_key(prefix, ""),
    })
}

fn home(value: &str) -> Result<PathBuf, StorageError> {
    std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| invalid(value, "`~` is the home directory, but HOME is not set"))
}

impl FromStr for StorageLocation {
    type Err = StorageError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        if value.trim().is_empty() {
            return Err(invalid(value, "it is empty"));
        }
        let scheme = value
            .split_once("://")
            .map(|(scheme, rest)| (scheme.to_ascii_lowercase(), rest));
        match scheme {
            Some((scheme, rest)) if scheme == "s3" => parse_s3(value, rest),
            Some((scheme, rest)) if scheme == "file" => {
                if rest.starts_with('/') {
                    Ok(Self::Local(PathBuf::from(rest)))
                } else {
                    Err(invalid(
                        value,
                        "a file URI names an absolute path: file:///PATH",
                    ))
                }
            }
            _ if value.starts_with('/') => Ok(Self::Local(PathBuf::from(value))),
            _ if value == "~" => Ok(Self::Local(home(value)?)),
            _ if value.starts_with("~/") => Ok(Self::Local(home(value)?.join(&value[2..]))),
            Some((scheme, _)) => Err(invalid(value, format!("`{scheme}://` is not supported"))),
            None => {
                let cwd = std::env::current_dir().map_err(|error| {
                    invalid(
                        value,
                        format!("a relative path needs the current directory, which cannot be read: {error}"),
                    )
                })?;
                Ok(Self::Local(cwd.join(Path::new(value))))
            }
        }
    }
}

/// Round-trips [`FromStr`]: a path as it is, `s3://bucket/prefix`.
impl fmt::Display for StorageLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local(path) => write!(f, "{}", path.display()),
            Self::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            Self::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(bucket: &str, prefix: &str) -> StorageLocation {
        StorageLocation::S3 {
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    #[test]
    fn what_a_user_writes_parses_to_the_location_it_means() {
        let home = PathBuf::from(std::env::var("HOME").unwrap());
        let cwd = std::env::current_dir().unwrap();
        let table = [
            (
                "/mnt/nfs/runs",
                StorageLocation::Local("/mnt/nfs/runs".into()),
            ),
            ("/", StorageLocation::Local("/".into())),
            ("runs", StorageLocation::Local(cwd.join("runs"))),
            ("./a/b", StorageLocation::Local(cwd.join("./a/b"))),
            ("~", StorageLocation::Local(home.clone())),
            ("~/results", StorageLocation::Local(home.join("results"))),
            (
                "file:///srv/runs",
                StorageLocation::Local("/srv/runs".into()),
            ),
            ("s3://bucket", s3("bucket", "")),
            ("s3://bucket/", s3("bucket", "")),
            ("s3://bucket/some/prefix", s3("bucket", "some/prefix")),
            ("s3://bucket//some//prefix/", s3("bucket", "some/prefix")),
            ("S3://my-bucket.v2/x", s3("my-bucket.v2", "x")),
        ];
        for (value, expected) in table {
            assert_eq!(
                value.parse::<StorageLocation>().unwrap(),
                expected,
                "{value}"
            );
        }
    }

    #[test]
    fn anything_else_is_refused_naming_the_value_and_what_is_accepted() {
        for value in [
            "",
            "  ",
            "gs://bucket/x",
            "http://host/x",
            "s3://",
            "s3:///prefix",
            "s3://bad bucket/x",
            "file://relative/path",
        ] {
            let error = value.parse::<StorageLocation>().unwrap_err();
            assert!(
                matches!(&error, StorageError::InvalidLocation { value: v, .. } if v == value),
                "{value}: {error:?}"
            );
            let text = error.to_string();
            assert!(text.contains(&format!("`{value}`")), "{text}");
            assert!(text.contains("s3://BUCKET[/PREFIX]"), "{text}");
        }
    }

    #[test]
    fn display_round_trips_through_parse() {
        for value in ["/a/b", "/", "s3://bucket", "s3://bucket/a/b"] {
            let location: StorageLocation = value.parse().unwrap();
            assert_eq!(location.to_string(), value);
            assert_eq!(
                location.to_string().parse::<StorageLocation>().unwrap(),
                location
            );
        }
    }

    #[test]
    fn join_appends_one_segment_and_split_last_undoes_it() {
        let local = StorageLocation::Local("/a".into()).join("run");
        assert_eq!(local.to_string(), "/a/run");
        assert_eq!(
            local.split_last(),
            Some((StorageLocation::Local("/a".into()), "run".into()))
        );
        let bucket = s3("b", "");
        assert_eq!(bucket.join("run"), s3("b", "run"));
        assert_eq!(
            bucket.join("run").split_last(),
            Some((bucket.clone(), "run".into()))
        );
        assert_eq!(s3("b", "p/q").join("run").to_string(), "s3://b/p/q/run");
        assert_eq!(bucket.split_last(), None);
        assert_eq!(StorageLocation::Local("/".into()).split_last(), None);
    }

    #[test]
    fn the_default_is_trainyard_results_in_the_home_directory() {
        let home = PathBuf::from(std::env::var("HOME").unwrap());
        assert_eq!(
            StorageLocation::default_local(),
            StorageLocation::Local(home.join("trainyard_results"))
        );
    }

    #[test]
    fn a_folder_is_below_its_base_only_without_going_up() {
        let base = Path::new("/runs/mnist");
        let below = |p: &str| relative_below(Path::new(p), base);
        assert_eq!(
            below("/runs/mnist/dcp/step_3"),
            Some("dcp/step_3".to_owned())
        );
        assert_eq!(below("/runs/mnist/./step_3/"), Some("step_3".to_owned()));
        assert_eq!(below("/runs/mnist"), None);
        assert_eq!(below("/runs/mnist2/step_3"), None);
        assert_eq!(below("/runs/mnist/../other/step_3"), None);
        assert_eq!(below("/runs/mnist/a/../../x"), None);
        assert_eq!(
            relative_below(Path::new("a/b"), Path::new("")),
            Some("a/b".to_owned())
        );
    }
}
