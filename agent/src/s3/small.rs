//! Small objects under the job's prefix, for the trigger exchange (docs/trigger.md, "Every
//! node of a job through S3"): `trainprof trigger` and the agents' relay both list, read,
//! write and remove requests and answers of a few KiB. Each call is bounded in time, each
//! read in bytes, each listing in keys: what a bucket writer put there is read as untrusted.
//!
//! Keys given and returned are relative to the store's prefix, like the uploader's.

use std::time::Duration;

use aws_sdk_s3::error::SdkError;
use aws_sdk_s3::primitives::ByteStream;

use super::store::{ErrorClass, Put, S3Store, StoreError, classify};

/// One listing: the objects (key relative to the prefix, size) and, with a delimiter, the
/// folders below it (relative, with their trailing `/`).
#[derive(Debug, Default)]
pub struct Listing {
    pub objects: Vec<(String, u64)>,
    pub folders: Vec<String>,
}

/// How far a listing goes.
#[derive(Debug, Clone, Copy)]
pub struct ListBound {
    /// Folders (`CommonPrefixes`) instead of everything below.
    pub delimiter: bool,
    /// Keys asked for per page (S3's `max-keys`).
    pub page_keys: i32,
    /// Entries (objects and folders together) after which no further page is asked for.
    pub entries: usize,
}

impl S3Store {
    /// The object `rel`: at most `max + 1` bytes read (a parser then says it is too large);
    /// `None` when there is none.
    pub async fn get_small(
        &self,
        rel: &str,
        max: u64,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let key = self.url().key(rel);
        let read = async {
            let got = self
                .client()
                .get_object()
                .bucket(&self.url().bucket)
                .key(&key)
                .range(format!("bytes=0-{max}"))
                .send()
                .await;
            let mut body = match got {
                Ok(o) => o.body,
                Err(SdkError::ServiceError(e)) if e.err().is_no_such_key() => return Ok(None),
                Err(e) => return Err(classify("GetObject", rel, &e)),
            };
            let limit = usize::try_from(max.saturating_add(1)).unwrap_or(usize::MAX);
            let mut out = Vec::new();
            while let Some(chunk) = body.try_next().await.map_err(|e| io_error("GetObject", rel, &e))? {
                let room = limit.saturating_sub(out.len());
                out.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if out.len() >= limit {
                    break;
                }
            }
            Ok(Some(out))
        };
        bounded("GetObject", rel, timeout, read).await
    }

    /// Writes `bytes` under `rel`; with `if_absent`, an existing object is left as it is
    /// and the answer is [`Put::Exists`] (`If-None-Match: *`).
    pub async fn put_small(
        &self,
        rel: &str,
        bytes: Vec<u8>,
        if_absent: bool,
        timeout: Duration,
    ) -> Result<Put, StoreError> {
        let key = self.url().key(rel);
        let sent = async {
            let reply = self
                .client()
                .put_object()
                .bucket(&self.url().bucket)
                .key(&key)
                .body(ByteStream::from(bytes))
                .set_if_none_match(if_absent.then(|| "*".to_owned()))
                .send()
                .await;
            match reply {
                Ok(_) => Ok(Put::Stored),
                Err(SdkError::ServiceError(e)) if e.raw().status().as_u16() == 412 => Ok(Put::Exists),
                Err(e) => Err(classify("PutObject", rel, &e)),
            }
        };
        bounded("PutObject", rel, timeout, sent).await
    }

    /// Removes `rel` (S3 answers the same whether it was there or not).
    pub async fn delete_small(&self, rel: &str, timeout: Duration) -> Result<(), StoreError> {
        let key = self.url().key(rel);
        let del = async {
            self.client()
                .delete_object()
                .bucket(&self.url().bucket)
                .key(&key)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| classify("DeleteObject", rel, &e))
        };
        bounded("DeleteObject", rel, timeout, del).await
    }

    /// What lies under `rel_prefix`, page after page until `bound.entries` or the end; each
    /// call bounded by `timeout`. Keys that are not under the store's prefix are left out.
    pub async fn list_small(
        &self,
        rel_prefix: &str,
        bound: ListBound,
        timeout: Duration,
    ) -> Result<Listing, StoreError> {
        let prefix = self.url().key(rel_prefix);
        // `base` is `prefix/`, or empty for a bucket's root.
        let base = self.url().key("");
        let relative = |k: &str| k.strip_prefix(base.as_str()).map(str::to_owned);
        let mut out = Listing::default();
        let mut token: Option<String> = None;
        loop {
            let page = bounded("ListObjectsV2", rel_prefix, timeout, async {
                self.client()
                    .list_objects_v2()
                    .bucket(&self.url().bucket)
                    .prefix(&prefix)
                    .set_delimiter(bound.delimiter.then(|| "/".to_owned()))
                    .max_keys(bound.page_keys)
                    .set_continuation_token(token.take())
                    .send()
                    .await
                    .map_err(|e| classify("ListObjectsV2", rel_prefix, &e))
            })
            .await?;
            for o in page.contents() {
                if let Some(k) = o.key().and_then(relative) {
                    let size = o.size().and_then(|s| u64::try_from(s).ok()).unwrap_or(u64::MAX);
                    out.objects.push((k, size));
                }
            }
            for p in page.common_prefixes() {
                if let Some(k) = p.prefix().and_then(relative) {
                    out.folders.push(k);
                }
            }
            match page.next_continuation_token() {
                Some(t)
                    if page.is_truncated() == Some(true)
                        && out.objects.len() + out.folders.len() < bound.entries =>
                {
                    token = Some(t.to_owned())
                }
                _ => break,
            }
        }
        Ok(out)
    }
}

fn io_error(op: &'static str, rel: &str, e: &dyn std::fmt::Display) -> StoreError {
    StoreError {
        class: ErrorClass::Retry,
        code: "io".into(),
        op,
        key: rel.to_owned(),
        detail: e.to_string(),
        file_only: false,
    }
}

/// `fut`, or a timeout error after `timeout`.
async fn bounded<T>(
    op: &'static str,
    rel: &str,
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(StoreError {
            class: ErrorClass::Retry,
            code: "timeout".into(),
            op,
            key: rel.to_owned(),
            detail: format!("no answer in {} s", timeout.as_secs()),
            file_only: false,
        }),
    }
}
