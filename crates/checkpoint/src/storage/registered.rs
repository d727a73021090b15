//! `NO_UPLOAD` hand-ins: checkpoints a rank wrote into the run folder itself (with torch's
//! distributed checkpoint, say), registered where they are instead of copied.

use std::path::Path;

use super::files::{checkpoint_index, is_temp};
use super::location::{StorageLocation, relative_below};
use super::run_folder::RunFolder;
use super::store::Placed;
use crate::{HandIn, LEASE_FILE, METRICS_FILE, RUN_FILE, StorageError};

/// The names at the top of a run folder that are trainyard's own: no checkpoint is
/// registered there (nor in a `checkpoint_<digits>` folder: those are trainyard's copies).
const OWN_NAMES: [&str; 6] = [
    RUN_FILE,
    super::STAGING_DIR,
    METRICS_FILE,
    LEASE_FILE,
    "logs",
    super::s3::OPEN_UPLOADS,
];

/// The most files a registered folder may hold: every rank's files are in it, so the task's
/// own bound on what one rank hands in does not apply; this keeps a listing finite.
const MAX_LISTED: u64 = 1 << 20;

impl RunFolder {
    /// Registers the folder at `location` (an absolute path or a URI inside this run
    /// folder, as [`RunFolder::dir_uri`] writes it) as what a rank hands in for checkpoint
    /// `index`, without copying anything: its files are listed. It holds every rank's files,
    /// so the bounds on what one rank hands in do not apply; at most 2^20 files are listed.
    ///
    /// # Errors
    /// [`StorageError::NotInRunFolder`] when `location` is not a folder with files inside
    /// the run folder (a local one reached through a link that leads out of it included),
    /// or is one of trainyard's own; the errors of the listing.
    pub async fn register_directory(
        &self,
        index: u64,
        location: &str,
    ) -> Result<HandIn, StorageError> {
        let dir = self.folder_within(location).await?;
        let (files, bytes) = self.store().list_files(&self.key(&dir), MAX_LISTED).await?;
        if files.is_empty() {
            return Err(self.not_registered(location, "it holds no files".to_owned()));
        }
        tracing::debug!(run = %self.name(), index, %dir, files = files.len(), bytes, "checkpoint registered in storage");
        Ok(HandIn::InStorage {
            index,
            dir,
            files,
            bytes,
        })
    }

    fn not_registered(&self, location: &str, reason: String) -> StorageError {
        StorageError::NotInRunFolder {
            path: location.to_owned(),
            run: self.uri(),
            reason,
        }
    }

    /// The folder that `location` names inside this run folder, relative to it with `/`
    /// separators, when a rank may register it.
    async fn folder_within(&self, location: &str) -> Result<String, StorageError> {
        let refused = |reason: &str| self.not_registered(location, reason.to_owned());
        // Relative to what? Not the agent's directory.
        if !location.starts_with('/') && !location.contains("://") {
            return Err(refused("it is neither an absolute path nor a URI"));
        }
        let parsed: StorageLocation = location
            .parse()
            .map_err(|_| refused("it is not a path or a supported URI"))?;
        let relative = match self.store().place(&self.key(""), parsed).await? {
            Placed::Below(relative) => relative,
            Placed::Outside => return Err(refused("it is not below it, links resolved")),
            Placed::Missing => return Err(refused("it does not exist")),
        };
        let top = relative.split('/').next().unwrap_or_default();
        if is_own(top) {
            return Err(self.not_registered(location, own_name(top)));
        }
        Ok(relative)
    }

    /// The folder that checkpoint `index`'s files are copied to when its report names it
    /// `name` (Ray Train's `checkpoint_dir_name`), relative to the run folder: `None` for the
    /// index's own folder (`checkpoint_000003`, and when `name` is that).
    ///
    /// # Errors
    /// [`StorageError::CheckpointDirName`] when `name` is not one folder name, is one of
    /// trainyard's own, or is a link that leads out of the run folder.
    pub(super) async fn named_folder(
        &self,
        index: u64,
        name: Option<&str>,
    ) -> Result<Option<String>, StorageError> {
        let Some(name) = name else {
            return Ok(None);
        };
        let refused = |reason: String| StorageError::CheckpointDirName {
            name: name.to_owned(),
            run: self.uri(),
            reason,
        };
        let folder = relative_below(Path::new(name), Path::new(""))
            .filter(|folder| !folder.contains('/'))
            .ok_or_else(|| refused("it is not one folder name".to_owned()))?;
        if folder == super::checkpoint_dir_name(index) {
            return Ok(None);
        }
        if is_own(&folder) {
            return Err(refused(own_name(&folder)));
        }
        let location = self.storage().location().join(self.name()).join(&folder);
        match self.store().place(&self.key(""), location).await? {
            Placed::Below(_) | Placed::Missing => Ok(Some(folder)),
            Placed::Outside => Err(refused("it leads out of the run folder".to_owned())),
        }
    }
}

/// Whether `top`, a name at the top of a run folder, is trainyard's own: its files, a
/// temporary file, or an index's folder (`checkpoint_<digits>`).
fn is_own(top: &str) -> bool {
    OWN_NAMES.contains(&top) || is_temp(top) || checkpoint_index(top).is_some()
}

/// Why the name `top` is refused.
fn own_name(top: &str) -> String {
    format!("`{top}` is trainyard's own: name the folder otherwise")
}
