//! `NO_UPLOAD` hand-ins: checkpoints a rank wrote into the run folder itself (with torch's
//! distributed checkpoint, say), registered where they are instead of copied.

use std::path::{Component, Path};

use super::files::{self, HandInLimits, checkpoint_index, is_temp};
use super::local::blocking;
use super::{Backend, RunFolder, StorageLocation, bucket_of, checkpoint_dir_name, location};
use crate::{HandIn, LEASE_FILE, METRICS_FILE, RUN_FILE, StorageError};

/// The names at the top of a run folder that are trainyard's own: no checkpoint is
/// registered there.
const OWN_NAMES: [&str; 4] = [RUN_FILE, METRICS_FILE, LEASE_FILE, "logs"];

impl RunFolder {
    /// Registers the folder at `location` (a path or URI inside this run folder, as
    /// [`RunFolder::dir_uri`] writes it) as what a rank hands in for checkpoint `index`,
    /// without copying anything: its files are listed, within `limits`.
    ///
    /// # Errors
    /// [`StorageError::NotInRunFolder`] when `location` is not a folder inside the run folder
    /// or is one of trainyard's own; [`StorageError::NotADirectory`] when nothing is there;
    /// the errors of the listing.
    pub async fn register_directory(
        &self,
        index: u64,
        location: &str,
        limits: HandInLimits,
    ) -> Result<HandIn, StorageError> {
        let dir = self.folder_within(location, index).await?;
        let (files, bytes) = self.list_folder(&dir, limits).await?;
        if files.is_empty() {
            return Err(StorageError::NotADirectory {
                path: location.to_owned(),
            });
        }
        tracing::debug!(run = %self.name, index, %dir, files = files.len(), bytes, "checkpoint registered in storage");
        Ok(HandIn::InStorage {
            index,
            dir,
            files,
            bytes,
        })
    }

    /// Every file under the folder `dir` of the run folder, sorted, and their total size;
    /// none when it does not exist on S3 (a local folder that does not exist is
    /// [`StorageError::NotADirectory`]).
    ///
    /// # Errors
    /// [`StorageError::TooManyFiles`], [`StorageError::TooLarge`], and the errors of the
    /// listing.
    pub async fn list_folder(
        &self,
        dir: &str,
        limits: HandInLimits,
    ) -> Result<(Vec<String>, u64), StorageError> {
        match &self.storage.backend {
            Backend::Local(root) => {
                let path = Self::local_dir(root, &self.name).join(dir);
                blocking("list", &path.clone(), move || {
                    let walked = files::walk_within(&path, limits)?;
                    let mut bytes = 0;
                    for file in &walked {
                        let meta = std::fs::symlink_metadata(&file.path)
                            .map_err(|e| files::io("read", &file.path, e))?;
                        bytes += meta.len();
                    }
                    Ok((walked.into_iter().map(|f| f.name).collect(), bytes))
                })
                .await
            }
            Backend::S3 { store, bucket, .. } => {
                let bucket = bucket_of(store, bucket);
                let prefix = self.key(dir);
                let mut objects = bucket.objects(&prefix).await?;
                objects.retain(|(name, _)| !name.rsplit('/').next().is_some_and(is_temp));
                objects.sort_by(|a, b| a.0.cmp(&b.0));
                let uri = || bucket.uri(&prefix);
                if limits
                    .files
                    .is_some_and(|limit| objects.len() as u64 > limit)
                {
                    return Err(StorageError::TooManyFiles {
                        path: uri(),
                        limit: limits.files.unwrap_or_default(),
                    });
                }
                let bytes = objects.iter().map(|(_, meta)| meta.size).sum::<u64>();
                if let Some(limit) = limits.bytes.filter(|limit| bytes > *limit) {
                    return Err(StorageError::TooLarge {
                        path: uri(),
                        bytes,
                        limit,
                    });
                }
                Ok((objects.into_iter().map(|(name, _)| name).collect(), bytes))
            }
        }
    }

    /// The folder that `location` names inside this run folder, relative to it with `/`
    /// separators, when a rank may register it for checkpoint `index`.
    async fn folder_within(&self, location: &str, index: u64) -> Result<String, StorageError> {
        let refused = |reason: String| StorageError::NotInRunFolder {
            path: location.to_owned(),
            run: self.uri(),
            reason,
        };
        let parsed: StorageLocation = location
            .parse()
            .map_err(|_| refused("it is not a path or a supported URI".to_owned()))?;
        let relative = match (&self.storage.backend, parsed) {
            (Backend::Local(root), StorageLocation::Local(path)) => {
                let run = Self::local_dir(root, &self.name);
                match relative_below(&path, &run) {
                    Some(relative) => Some(relative),
                    // The same folder reached through a link (`/tmp` → `/private/tmp`).
                    None => {
                        let resolved = (path.clone(), run.clone());
                        blocking("read", &path, move || {
                            let (path, run) = resolved;
                            Ok(std::fs::canonicalize(&path)
                                .ok()
                                .zip(std::fs::canonicalize(&run).ok()))
                        })
                        .await?
                        .and_then(|(path, run)| relative_below(&path, &run))
                    }
                }
            }
            (
                Backend::S3 { bucket, prefix, .. },
                StorageLocation::S3 {
                    bucket: b,
                    prefix: p,
                },
            ) if *bucket == b => {
                let run = location::join_key(prefix, &self.name);
                p.strip_prefix(&run)
                    .and_then(|rest| rest.strip_prefix('/'))
                    .and_then(|rest| relative_below(Path::new(rest), Path::new("")))
            }
            _ => None,
        };
        let Some(relative) = relative else {
            return Err(refused("it is not below it".to_owned()));
        };
        let top = relative.split('/').next().unwrap_or_default();
        if OWN_NAMES.contains(&top) || is_temp(top) {
            return Err(refused(format!("`{top}` is trainyard's own")));
        }
        if checkpoint_index(top).is_some_and(|other| other != index) {
            return Err(refused(format!(
                "`{top}` is named like another checkpoint's folder; this report's is `{}`",
                checkpoint_dir_name(index)
            )));
        }
        Ok(relative)
    }
}

/// `path` relative to `base`, with `/` separators, when it is a folder below it: lexically,
/// and with no `..` in what is left.
fn relative_below(path: &Path, base: &Path) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
