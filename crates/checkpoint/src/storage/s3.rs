//! S3 (or an S3 API server), through [`object_store`].
//!
//! Every object appears only when its upload completes (a single `PUT`, or the completion of
//! a multipart upload), so no temporary names are needed: a failed upload is aborted and
//! leaves nothing under its key.
//!
//! A multipart upload cut off by a killed agent would keep its parts (and their cost) until
//! a bucket's lifecycle rule removed them: S3 lists no upload to a client that does not know
//! it. So each one is recorded while it is open, as a small object in the run folder's
//! [`OPEN_UPLOADS`] folder naming its key and id; the next attempt aborts what is recorded
//! there ([`Bucket::abort_open_uploads`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as Key;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload,
    RetryConfig,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::files::{SourceFile, io, random_suffix, tally, temp_name};
use crate::StorageError;

/// Files uploaded, or downloaded, at once.
const PARALLEL_FILES: usize = 4;
/// Parts of one file uploaded at once.
const PARALLEL_PARTS: usize = 4;
/// The size of a part of a multipart upload; files up to it go in a single `PUT`.
const PART_SIZE: usize = 8 * 1024 * 1024;
/// The folder of a run folder where open multipart uploads are recorded.
pub(crate) const OPEN_UPLOADS: &str = ".uploads";

/// What records an open multipart upload.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct OpenUpload {
    key: String,
    id: String,
}

/// The store of `bucket`, configured from `env` (never from the process's environment):
/// credentials, region, an endpoint override (path-style requests), plain HTTP.
///
/// Connections time out after 5 s and a request is retried at most 3 times within 10 s, so
/// that an endpoint where nothing listens fails in seconds rather than minutes.
pub(crate) fn open(
    bucket: &str,
    env: &BTreeMap<String, String>,
) -> Result<Arc<AmazonS3>, object_store::Error> {
    let var = |name: &str| env.get(name).map(String::as_str).filter(|v| !v.is_empty());
    let endpoint = var("AWS_ENDPOINT_URL").or_else(|| var("AWS_ENDPOINT"));
    let allow_http = var("AWS_ALLOW_HTTP")
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on"))
        || endpoint.is_some_and(|e| e.to_ascii_lowercase().starts_with("http://"));
    let client = ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_read_timeout(Duration::from_secs(30))
        .with_timeout(Duration::from_secs(300))
        .with_allow_http(allow_http);
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: 3,
        retry_timeout: Duration::from_secs(10),
    };
    let region = var("AWS_REGION")
        .or_else(|| var("AWS_DEFAULT_REGION"))
        .unwrap_or("us-east-1");
    let mut builder = AmazonS3Builder::new()
        .with_client_options(client)
        .with_retry(retry)
        .with_bucket_name(bucket)
        .with_region(region)
        .with_virtual_hosted_style_request(false);
    if let Some(key) = var("AWS_ACCESS_KEY_ID") {
        builder = builder.with_access_key_id(key);
    }
    if let Some(secret) = var("AWS_SECRET_ACCESS_KEY") {
        builder = builder.with_secret_access_key(secret);
    }
    if let Some(token) = var("AWS_SESSION_TOKEN") {
        builder = builder.with_token(token);
    }
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    Ok(Arc::new(builder.build()?))
}

/// One bucket's store, and how to name its objects for a user.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket<'a> {
    pub(crate) store: &'a Arc<AmazonS3>,
    pub(crate) name: &'a str,
}

fn failed(action: &'static str, uri: String, error: object_store::Error) -> StorageError {
    StorageError::Io {
        action,
        path: uri,
        source: Box::new(error),
    }
}

/// The key `prefix/name` (`name` may hold `/`).
pub(crate) fn key(prefix: &str, name: &str) -> Key {
    Key::from(super::location::join_key(prefix, name))
}

/// `name` is a relative path that stays inside the folder it is joined to.
fn safe_relative(name: &str) -> bool {
    !name.is_empty()
        && name
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

impl Bucket<'_> {
    /// `s3://bucket/key`.
    pub(crate) fn uri(&self, key: &Key) -> String {
        if key.as_ref().is_empty() {
            format!("s3://{}", self.name)
        } else {
            format!("s3://{}/{key}", self.name)
        }
    }

    /// Writes, reads back and deletes a probe under `prefix`.
    pub(crate) async fn check_writable(&self, prefix: &str) -> Result<(), StorageError> {
        let probe = key(
            prefix,
            &format!(".trainyard-write-check-{}", random_suffix()),
        );
        let uri = self.uri(&probe);
        let content: &'static [u8] = b"trainyard write check";
        self.store
            .put(&probe, PutPayload::from_static(content))
            .await
            .map_err(|e| failed("write", uri.clone(), e))?;
        let back = match self.store.get(&probe).await {
            Ok(result) => result.bytes().await,
            Err(error) => Err(error),
        };
        let deleted = self.store.delete(&probe).await;
        let back = back.map_err(|e| failed("read", uri.clone(), e))?;
        if back.as_ref() != content {
            return Err(StorageError::Io {
                action: "read",
                path: uri,
                source: "the probe read back differs from what was written".into(),
            });
        }
        deleted.map_err(|e| failed("delete", uri, e))
    }

    /// The object at `key`; `None` when there is none.
    pub(crate) async fn get(&self, key: &Key) -> Result<Option<Vec<u8>>, StorageError> {
        self.get_with(key, GetOptions::default()).await
    }

    /// The last `bytes` of the object at `key` (all of it when smaller); `None` when there
    /// is none.
    pub(crate) async fn tail(
        &self,
        key: &Key,
        bytes: u64,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let options = GetOptions {
            range: Some(GetRange::Suffix(bytes)),
            ..GetOptions::default()
        };
        self.get_with(key, options).await
    }

    async fn get_with(
        &self,
        key: &Key,
        options: GetOptions,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let result = match self.store.get_opts(key, options).await {
            Ok(result) => result.bytes().await,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(error) => Err(error),
        };
        result
            .map(|bytes| Some(bytes.to_vec()))
            .map_err(|e| failed("read", self.uri(key), e))
    }

    /// Whether an object is at `key`.
    pub(crate) async fn exists(&self, key: &Key) -> Result<bool, StorageError> {
        match self.store.head(key).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(error) => Err(failed("read", self.uri(key), error)),
        }
    }

    /// Puts `bytes` at `key` in one request: readers see the old object or the new one.
    pub(crate) async fn put(&self, key: &Key, bytes: Vec<u8>) -> Result<(), StorageError> {
        self.store
            .put(key, PutPayload::from(bytes))
            .await
            .map(drop)
            .map_err(|e| failed("write", self.uri(key), e))
    }

    /// Every object under `prefix`, with its name relative to it.
    pub(crate) async fn list(&self, prefix: &Key) -> Result<Vec<(String, Key)>, StorageError> {
        Ok(self
            .objects(prefix)
            .await?
            .into_iter()
            .map(|(name, meta)| (name, meta.location))
            .collect())
    }

    /// Every object under `prefix`, with its name relative to it and what the store says of
    /// it (its size, say).
    pub(crate) async fn objects(
        &self,
        prefix: &Key,
    ) -> Result<Vec<(String, object_store::ObjectMeta)>, StorageError> {
        let metas: Vec<_> = self
            .store
            .list(Some(prefix))
            .try_collect()
            .await
            .map_err(|e| failed("list", self.uri(prefix), e))?;
        let strip = prefix.as_ref();
        Ok(metas
            .into_iter()
            .filter_map(|meta| {
                let full = meta.location.as_ref();
                let relative = if strip.is_empty() {
                    full
                } else {
                    full.strip_prefix(strip)?.strip_prefix('/')?
                };
                Some((relative.to_owned(), meta))
            })
            .collect())
    }

    /// The names of the folders directly under `prefix` (common prefixes: one listing with a
    /// delimiter, however many objects the folders hold).
    pub(crate) async fn folders(&self, prefix: &Key) -> Result<Vec<String>, StorageError> {
        let listed = self
            .store
            .list_with_delimiter(Some(prefix))
            .await
            .map_err(|e| failed("list", self.uri(prefix), e))?;
        Ok(listed
            .common_prefixes
            .iter()
            .filter_map(|folder| folder.filename().map(str::to_owned))
            .collect())
    }

    /// Deletes every object of `keys` (under `folder`, which an error names); one already
    /// gone is not an error.
    pub(crate) async fn delete(&self, keys: Vec<Key>, folder: &Key) -> Result<(), StorageError> {
        if keys.is_empty() {
            return Ok(());
        }
        let stream = futures::stream::iter(keys.into_iter().map(Ok)).boxed();
        let results: Vec<_> = self.store.delete_stream(stream).collect().await;
        for result in results {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(failed("delete", self.uri(folder), error)),
            }
        }
        Ok(())
    }

    /// Uploads every file of `files` under `prefix`; their total size. On a failure, the
    /// uploads still running are aborted, those complete are deleted, and the first error
    /// is returned. Multipart uploads are recorded under `journal` while they are open.
    pub(crate) async fn upload(
        &self,
        prefix: &str,
        files: Vec<SourceFile>,
        journal: &Key,
    ) -> Result<u64, StorageError> {
        let stop = AtomicBool::new(false);
        let results: Vec<(Key, Result<Option<u64>, StorageError>)> = futures::stream::iter(files)
            .map(|file| {
                let stop = &stop;
                let key = key(prefix, &file.name);
                async move {
                    if stop.load(Ordering::Relaxed) {
                        return (key, Ok(None));
                    }
                    let result = self.upload_file(&file.path, &key, journal).await;
                    if result.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    (key, result.map(Some))
                }
            })
            .buffer_unordered(PARALLEL_FILES)
            .collect()
            .await;
        match tally(results) {
            Ok(total) => Ok(total),
            Err((error, written)) => {
                if let Err(cleanup) = self.delete(written, &key(prefix, "")).await {
                    tracing::warn!(error = %cleanup, "the files of a failed checkpoint upload could not be deleted");
                }
                Err(error)
            }
        }
    }

    /// Uploads one file, in parts when it is larger than one part; then the upload is
    /// recorded under `journal` until it is complete or aborted.
    async fn upload_file(
        &self,
        path: &Path,
        key: &Key,
        journal: &Key,
    ) -> Result<u64, StorageError> {
        let uri = self.uri(key);
        let copy_failed = |source: Box<dyn std::error::Error + Send + Sync>| StorageError::Copy {
            from: path.display().to_string(),
            to: uri.clone(),
            source,
        };
        let opened = path.to_path_buf();
        let mut file = tokio::fs::File::from_std(
            tokio::task::spawn_blocking(move || super::files::open_regular(&opened))
                .await
                .map_err(|e| copy_failed(Box::new(e)))??,
        );
        let len = file
            .metadata()
            .await
            .map_err(|e| copy_failed(Box::new(e)))?
            .len();
        if len <= PART_SIZE as u64 {
            let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(PART_SIZE));
            file.read_to_end(&mut bytes)
                .await
                .map_err(|e| copy_failed(Box::new(e)))?;
            let size = bytes.len() as u64;
            self.store
                .put(key, PutPayload::from(bytes))
                .await
                .map_err(|e| copy_failed(Box::new(e)))?;
            return Ok(size);
        }
        // A kill between the create and the record leaves an upload no record names (its id
        // is known only once created): the bucket's lifecycle rule is left for that moment.
        let id = self
            .store
            .create_multipart(key)
            .await
            .map_err(|e| copy_failed(Box::new(e)))?;
        let record = journal.clone().join(random_suffix());
        let uploaded = match serde_json::to_vec(&OpenUpload {
            key: key.to_string(),
            id: id.clone(),
        }) {
            Ok(bytes) => match self.put(&record, bytes).await {
                Ok(()) => self.upload_parts(&mut file, key, &id).await,
                Err(error) => Err(Box::new(error) as Box<dyn std::error::Error + Send + Sync>),
            },
            Err(error) => Err(Box::new(error) as Box<dyn std::error::Error + Send + Sync>),
        };
        if uploaded.is_err() && !self.abort_upload(key, &id).await {
            tracing::warn!(
                uri,
                "a failed multipart upload could not be aborted; the next attempt aborts it"
            );
            return uploaded.map_err(copy_failed);
        }
        // Complete or aborted: nothing to abort later. Left behind, the record only costs
        // the next attempt an abort of an upload that is gone.
        if let Err(error) = self.delete(vec![record], journal).await {
            tracing::debug!(uri, %error, "the record of a finished multipart upload was left");
        }
        uploaded.map_err(copy_failed)
    }

    /// Aborts the multipart upload `id` of `key`, once more after a failure (object_store
    /// does not retry an abort); whether it is gone.
    async fn abort_upload(&self, key: &Key, id: &str) -> bool {
        let id = id.to_owned();
        for _ in 0..2 {
            match self.store.abort_multipart(key, &id).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => return true,
                Err(error) => {
                    tracing::debug!(uri = self.uri(key), %error, "a multipart upload could not be aborted");
                }
            }
        }
        false
    }

    /// Streams `file` into the multipart upload `id` of `key`, [`PARALLEL_PARTS`] parts at
    /// once (each on a task of its own: a part's payload is hashed as it is sent), and
    /// completes it; the bytes uploaded. The parts still running are aborted if it fails.
    async fn upload_parts(
        &self,
        file: &mut tokio::fs::File,
        key: &Key,
        id: &str,
    ) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
        let id = id.to_owned();
        let mut parts: Vec<(usize, PartId)> = Vec::new();
        let mut running = tokio::task::JoinSet::new();
        let mut size = 0_u64;
        for index in 0.. {
            if running.len() >= PARALLEL_PARTS {
                if let Some(done) = running.join_next().await {
                    parts.push(done??);
                }
            }
            let mut chunk = vec![0; PART_SIZE];
            let mut filled = 0;
            while filled < PART_SIZE {
                let read = file.read(&mut chunk[filled..]).await?;
                if read == 0 {
                    break;
                }
                filled += read;
            }
            if filled == 0 {
                break;
            }
            chunk.truncate(filled);
            size += filled as u64;
            let store = Arc::clone(self.store);
            let (key, id) = (key.clone(), id.clone());
            running.spawn(async move {
                let part = store
                    .put_part(&key, &id, index, PutPayload::from(chunk))
                    .await?;
                Ok::<_, object_store::Error>((index, part))
            });
            if filled < PART_SIZE {
                break;
            }
        }
        while let Some(done) = running.join_next().await {
            parts.push(done??);
        }
        parts.sort_by_key(|(index, _)| *index);
        let parts = parts.into_iter().map(|(_, part)| part).collect();
        self.store.complete_multipart(key, &id, parts).await?;
        Ok(size)
    }

    /// Aborts every multipart upload recorded under `journal` (each cut off by an agent
    /// that was killed mid-upload) and deletes the records of those gone; how many were
    /// aborted. What cannot be read, aborted or deleted is warned about and left for the
    /// next attempt: this is a sweep, not a step a run may fail on.
    pub(crate) async fn abort_open_uploads(&self, journal: &Key) -> usize {
        let records = match self.list(journal).await {
            Ok(records) => records,
            Err(error) => {
                tracing::warn!(%error, "the records of open multipart uploads could not be listed");
                return 0;
            }
        };
        let mut aborted = 0;
        let mut done = Vec::new();
        for (_, record) in records {
            let open = match self.get(&record).await {
                Ok(Some(bytes)) => serde_json::from_slice::<OpenUpload>(&bytes).ok(),
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(%error, "the record of an open multipart upload could not be read");
                    continue;
                }
            };
            match open.map(|open| (Key::parse(&open.key), open.id)) {
                Some((Ok(key), id)) => {
                    if !self.abort_upload(&key, &id).await {
                        tracing::warn!(
                            uri = self.uri(&key),
                            "an open multipart upload could not be aborted; it is tried again at the next attempt"
                        );
                        continue;
                    }
                    aborted += 1;
                }
                _ => {
                    tracing::warn!(
                        uri = self.uri(&record),
                        "not a record of a multipart upload; deleted"
                    );
                }
            }
            done.push(record);
        }
        if let Err(error) = self.delete(done, journal).await {
            tracing::warn!(%error, "the records of aborted multipart uploads could not be deleted");
        }
        aborted
    }

    /// Downloads every object under `prefix` into `dest` (created); how many there were.
    /// Each file is written under a temporary name and renamed when complete.
    pub(crate) async fn download(&self, prefix: &Key, dest: &Path) -> Result<usize, StorageError> {
        let objects = self.list(prefix).await?;
        if let Some((name, key)) = objects.iter().find(|(name, _)| !safe_relative(name)) {
            return Err(StorageError::Io {
                action: "download",
                path: self.uri(key),
                source: format!(
                    "the object's name `{name}` would land outside `{}`",
                    dest.display()
                )
                .into(),
            });
        }
        let made = dest.to_path_buf();
        unblocked(move || trainyard_sys::private::dir_all(&made))
            .await
            .map_err(|e| io("create", dest, e))?;
        let count = objects.len();
        futures::stream::iter(objects)
            .map(|(name, key)| async move { self.download_file(&key, &dest.join(name)).await })
            .buffer_unordered(PARALLEL_FILES)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(count)
    }

    async fn download_file(&self, key: &Key, to: &Path) -> Result<(), StorageError> {
        let uri = self.uri(key);
        let copy_failed = |source: Box<dyn std::error::Error + Send + Sync>| StorageError::Copy {
            from: uri.clone(),
            to: to.display().to_string(),
            source,
        };
        let (Some(dir), Some(file_name)) = (to.parent(), to.file_name().and_then(|n| n.to_str()))
        else {
            return Err(copy_failed("not a file path".into()));
        };
        let made = dir.to_path_buf();
        unblocked(move || trainyard_sys::private::dir_all(&made))
            .await
            .map_err(|e| io("create", dir, e))?;
        let temp: PathBuf = dir.join(temp_name(file_name));
        let written: Result<(), Box<dyn std::error::Error + Send + Sync>> = async {
            let mut stream = self.store.get(key).await?.into_stream();
            let made = temp.clone();
            let file = unblocked(move || trainyard_sys::private::create_new(&made)).await?;
            let mut file = tokio::fs::File::from_std(file);
            while let Some(chunk) = stream.next().await {
                file.write_all(&chunk?).await?;
            }
            file.flush().await?;
            tokio::fs::rename(&temp, to).await?;
            Ok(())
        }
        .await;
        if let Err(error) = written {
            // Best effort: the temporary file may not exist.
            let _ = tokio::fs::remove_file(&temp).await;
            return Err(copy_failed(error));
        }
        Ok(())
    }
}

/// `work` (file system calls) on tokio's blocking pool.
async fn unblocked<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(error) => Err(std::io::Error::other(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_names_that_climb_out_are_refused() {
        for name in ["a", "a/b.pt", ".hidden/x"] {
            assert!(safe_relative(name), "{name}");
        }
        for name in ["", "../x", "a/../../x", "a//b", "./a", "/abs"] {
            assert!(!safe_relative(name), "{name}");
        }
    }

    #[test]
    fn keys_join_the_prefix_and_the_name() {
        assert_eq!(key("", "a/b").as_ref(), "a/b");
        assert_eq!(key("p/q", "run.json").as_ref(), "p/q/run.json");
    }
}
