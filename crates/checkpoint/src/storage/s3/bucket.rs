//! [`Bucket`]: the objects of one S3 bucket (or an S3 API server's), through
//! [`object_store`]: read, written, listed and deleted, each failure naming the object's URI.
//!
//! Every object appears only when its upload completes (a single `PUT`, or the completion of
//! a multipart upload), so no temporary names are needed: readers see an object whole or not
//! at all.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload,
    RetryConfig, WriteMultipart,
};

use crate::StorageError;
use crate::storage::files::random_suffix;
use crate::storage::location::join_key;

/// The largest object S3 copies in one request (`CopyObject`).
const COPY_LIMIT: u64 = 5 << 30;
/// Parts of one object streamed at once when it is too large to copy in one request.
const PARALLEL_PARTS: usize = 4;

/// One bucket's store, and how to name its objects for a user.
#[derive(Debug, Clone)]
pub(super) struct Bucket {
    pub(super) store: Arc<AmazonS3>,
    pub(super) name: String,
}

/// [`StorageError::Io`] of a request about `uri`.
fn failed(action: &'static str, uri: String, error: object_store::Error) -> StorageError {
    StorageError::Io {
        action,
        path: uri,
        source: Box::new(error),
    }
}

/// Whether the value of a yes-or-no variable says yes.
fn is_yes(value: &str) -> bool {
    matches!(
        value.to_ascii_lowercase().as_str(),
        "true" | "1" | "yes" | "on"
    )
}

/// The key `prefix/name` (`name` may hold `/`).
pub(super) fn key(prefix: &str, name: &str) -> Key {
    Key::from(join_key(prefix, name))
}

impl Bucket {
    /// The bucket `bucket`, its store configured from `env` (never from the process's
    /// environment): credentials, region, an endpoint override (path-style requests), plain
    /// HTTP.
    ///
    /// Connections time out after 5 s and a request is retried at most 3 times within 10 s,
    /// so that an endpoint where nothing listens fails in seconds rather than minutes.
    pub(super) fn open(
        bucket: &str,
        env: &BTreeMap<String, String>,
    ) -> Result<Self, object_store::Error> {
        let var = |name: &str| env.get(name).map(String::as_str).filter(|v| !v.is_empty());
        let endpoint = var("AWS_ENDPOINT_URL").or_else(|| var("AWS_ENDPOINT"));
        let allow_http = var("AWS_ALLOW_HTTP").is_some_and(is_yes)
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
        Ok(Self {
            store: Arc::new(builder.build()?),
            name: bucket.to_owned(),
        })
    }

    /// `s3://bucket/key`.
    pub(super) fn uri(&self, key: &Key) -> String {
        if key.as_ref().is_empty() {
            format!("s3://{}", self.name)
        } else {
            format!("s3://{}/{key}", self.name)
        }
    }

    /// Writes, reads back and deletes a probe under `prefix`.
    pub(super) async fn check_writable(&self, prefix: &str) -> Result<(), StorageError> {
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
    pub(super) async fn get(&self, key: &Key) -> Result<Option<Vec<u8>>, StorageError> {
        self.get_with(key, GetOptions::default()).await
    }

    /// The last `bytes` of the object at `key` (all of it when smaller); `None` when there
    /// is none.
    pub(super) async fn tail(
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
    pub(super) async fn exists(&self, key: &Key) -> Result<bool, StorageError> {
        match self.store.head(key).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(error) => Err(failed("read", self.uri(key), error)),
        }
    }

    /// Puts `bytes` at `key` in one request: readers see the old object or the new one.
    pub(super) async fn put(&self, key: &Key, bytes: Vec<u8>) -> Result<(), StorageError> {
        self.store
            .put(key, PutPayload::from(bytes))
            .await
            .map(drop)
            .map_err(|e| failed("write", self.uri(key), e))
    }

    /// Copies the object at `from`, of `size` bytes, to `to`, on the server: one `CopyObject`,
    /// or, beyond what S3 copies in one request (5 GiB), streamed through this process into
    /// a multipart upload.
    pub(super) async fn copy(&self, from: &Key, to: &Key, size: u64) -> Result<(), StorageError> {
        let copied = if size <= COPY_LIMIT {
            self.store.copy(from, to).await
        } else {
            self.stream_copy(from, to).await
        };
        copied.map_err(|e| failed("copy", self.uri(to), e))
    }

    async fn stream_copy(&self, from: &Key, to: &Key) -> Result<(), object_store::Error> {
        let mut source = self.store.get(from).await?.into_stream();
        let mut upload = WriteMultipart::new(self.store.put_multipart(to).await?);
        let streamed = async {
            while let Some(chunk) = source.try_next().await? {
                upload.wait_for_capacity(PARALLEL_PARTS).await?;
                upload.put(chunk);
            }
            Ok::<_, object_store::Error>(())
        }
        .await;
        match streamed {
            Ok(()) => upload.finish().await.map(drop),
            Err(error) => {
                // Best effort: the parts sent are of no use.
                let _ = upload.abort().await;
                Err(error)
            }
        }
    }

    /// Every object under `prefix`, with its name relative to it.
    pub(super) async fn list(&self, prefix: &Key) -> Result<Vec<(String, Key)>, StorageError> {
        Ok(self
            .objects(prefix)
            .await?
            .into_iter()
            .map(|(name, meta)| (name, meta.location))
            .collect())
    }

    /// Every object under `prefix`, with its name relative to it and what the store says of
    /// it (its size, say).
    pub(super) async fn objects(
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
    pub(super) async fn folders(&self, prefix: &Key) -> Result<Vec<String>, StorageError> {
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
    pub(super) async fn delete(&self, keys: Vec<Key>, folder: &Key) -> Result<(), StorageError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_join_the_prefix_and_the_name() {
        assert_eq!(key("", "a/b").as_ref(), "a/b");
        assert_eq!(key("p/q", "run.json").as_ref(), "p/q/run.json");
    }
}
