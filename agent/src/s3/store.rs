//! The object store the uploader writes to: a trait, its S3 implementation (aws-sdk-s3),
//! and the classification of S3's errors.
//!
//! Keys given to a store are paths relative to `LocalPath` (`system/incremental/…`); the
//! store puts its own prefix in front.

use std::future::Future;
use std::time::Duration;

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::{ByteStream, Length};
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};

/// How a failed request is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The network, a timeout, a 5xx: try again soon.
    Retry,
    /// The store asks us to slow down (503 SlowDown, 429): back off from a higher base.
    Throttled,
    /// Retrying the same request will not help until someone acts (AccessDenied,
    /// NoSuchBucket, bad credentials): reported loudly once, then probed at the cap.
    Fatal,
}

/// What the store holds under a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub len: u64,
    /// As the store reports it, quotes removed: the MD5 of the bytes in hex for an object
    /// sent in one piece; `<hex>-<parts>` for a multipart upload.
    pub etag: Option<String>,
}

/// A failed request, classified. Never carries credentials.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{op} {key}: {code}: {detail}")]
pub struct StoreError {
    pub class: ErrorClass,
    /// The store's error code (`NoSuchBucket`, `SlowDown`) or the kind of failure
    /// (`connection`, `timeout`, `io`).
    pub code: String,
    pub op: &'static str,
    pub key: String,
    pub detail: String,
    /// The error concerns this file only (a local read error, a key S3 will not take):
    /// the file is set aside and the others go on, with no back-off.
    pub file_only: bool,
}

impl StoreError {
    /// The SDK found no credentials in any source of its chain.
    pub fn is_no_credentials(&self) -> bool {
        self.code == NO_CREDENTIALS
    }
}

/// [`StoreError::code`] when the credential chain found nothing.
pub const NO_CREDENTIALS: &str = "NoCredentials";

/// Where the uploader puts files. `Send + Sync + 'static` so that uploads run as tasks.
pub trait ObjectStore: Send + Sync + 'static {
    /// `s3://bucket/prefix`, for logs.
    fn describe(&self) -> String;
    /// What is stored under `key`, if anything.
    fn head(&self, key: &str) -> impl Future<Output = Result<Option<Remote>, StoreError>> + Send;
    /// Stores the first `len` bytes of the open `file` under `key`; `Stored` only once the
    /// store confirmed it. With `if_absent`, an existing object is left as it is and the
    /// answer is `Exists` (S3: `If-None-Match: *`, atomic on the server, and needing no
    /// permission beyond `PutObject`).
    fn put_file(
        &self,
        key: &str,
        file: &std::fs::File,
        len: u64,
        if_absent: bool,
    ) -> impl Future<Output = Result<Put, StoreError>> + Send;
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    Stored,
    /// `if_absent` and the key was taken: nothing written.
    Exists,
}

/// `s3://bucket/prefix`, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    pub bucket: String,
    /// Without leading or trailing `/`; may be empty.
    pub prefix: String,
}

/// Why a string is not an `s3://bucket/prefix` URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum S3UrlError {
    #[error("{0:?} does not start with s3://")]
    NotS3(String),
    #[error("{0:?} names no bucket")]
    NoBucket(String),
}

impl S3Url {
    pub fn parse(url: &str) -> Result<S3Url, S3UrlError> {
        let rest = url.strip_prefix("s3://").ok_or_else(|| S3UrlError::NotS3(url.to_owned()))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(S3UrlError::NoBucket(url.to_owned()));
        }
        Ok(S3Url { bucket: bucket.to_owned(), prefix: prefix.trim_matches('/').to_owned() })
    }

    pub fn key(&self, rel: &str) -> String {
        if self.prefix.is_empty() { rel.to_owned() } else { format!("{}/{rel}", self.prefix) }
    }
}

/// How the S3 client is made.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// `--s3-endpoint`; `AWS_ENDPOINT_URL(_S3)` is read by the SDK itself. Either one
    /// switches to path-style addressing, which S3-compatible servers expect.
    pub endpoint: Option<String>,
    /// Files larger than this go up in parts.
    pub multipart_threshold: u64,
    pub part_size: u64,
}

impl Default for S3Options {
    fn default() -> S3Options {
        S3Options { endpoint: None, multipart_threshold: 16 << 20, part_size: 8 << 20 }
    }
}

/// S3 through aws-sdk-s3: credentials from the standard chain (environment, profile, the
/// container endpoint of ECS and SageMaker, the instance profile), region from the
/// environment or us-east-1. The SDK's own retries are off: the uploader classifies and
/// backs off itself.
#[derive(Debug, Clone)]
pub struct S3Store {
    client: aws_sdk_s3::Client,
    url: S3Url,
    options: S3Options,
}

impl S3Store {
    pub async fn connect(url: S3Url, options: S3Options) -> S3Store {
        use aws_config::retry::RetryConfig;
        use aws_config::timeout::TimeoutConfig;
        use aws_smithy_http_client::tls;

        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
            .build_https();
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(3))
            .read_timeout(Duration::from_secs(30))
            .operation_attempt_timeout(Duration::from_secs(120))
            .build();
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(http)
            .retry_config(RetryConfig::disabled())
            .timeout_config(timeouts);
        if let Some(e) = &options.endpoint {
            loader = loader.endpoint_url(e);
        }
        let shared = loader.load().await;
        let path_style = options.endpoint.is_some()
            || ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"].iter().any(|v| std::env::var_os(v).is_some());
        let mut config = aws_sdk_s3::config::Builder::from(&shared).force_path_style(path_style);
        if shared.region().is_none() {
            // Requests are signed for a region; S3 redirects wrong guesses with an error
            // that names the right one (PermanentRedirect, logged).
            config = config.region(aws_config::Region::from_static("us-east-1"));
        }
        let config = config.build();
        S3Store { client: aws_sdk_s3::Client::from_conf(config), url, options }
    }

    /// The client, made as above: for `trainprof report s3://…` and the page at the end of
    /// `run --s3`, which read with the uploader's credentials and endpoint.
    pub fn client(&self) -> &aws_sdk_s3::Client {
        &self.client
    }

    pub fn url(&self) -> &S3Url {
        &self.url
    }

    async fn put_multipart(
        &self,
        rel: &str,
        key: &str,
        file: &std::fs::File,
        len: u64,
        if_absent: bool,
    ) -> Result<Put, StoreError> {
        let op = "CreateMultipartUpload";
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.url.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| classify(op, rel, &e))?;
        let Some(id) = created.upload_id() else {
            return Err(store_error(ErrorClass::Retry, "NoUploadId", op, rel, "the reply has no upload id"));
        };
        let sent = self.send_parts(rel, key, id, file, len, if_absent).await;
        if !matches!(sent, Ok(Put::Stored)) {
            // Parts of an unfinished upload cost storage until aborted; best effort.
            let _ = self
                .client
                .abort_multipart_upload()
                .bucket(&self.url.bucket)
                .key(key)
                .upload_id(id)
                .send()
                .await;
        }
        sent
    }

    async fn send_parts(
        &self,
        rel: &str,
        key: &str,
        id: &str,
        file: &std::fs::File,
        len: u64,
        if_absent: bool,
    ) -> Result<Put, StoreError> {
        let part_size = self.options.part_size.max(5 << 20);
        let mut parts = Vec::new();
        let mut offset = 0;
        let mut number = 1;
        while offset < len {
            let size = part_size.min(len - offset);
            let body = file_body(file, offset, size, "UploadPart", rel).await?;
            let out = self
                .client
                .upload_part()
                .bucket(&self.url.bucket)
                .key(key)
                .upload_id(id)
                .part_number(number)
                .body(body)
                .send()
                .await
                .map_err(|e| classify("UploadPart", rel, &e))?;
            parts.push(
                CompletedPart::builder()
                    .part_number(number)
                    .set_e_tag(out.e_tag().map(str::to_owned))
                    .set_checksum_crc32(out.checksum_crc32().map(str::to_owned))
                    .build(),
            );
            offset += size;
            number += 1;
        }
        let done = self
            .client
            .complete_multipart_upload()
            .bucket(&self.url.bucket)
            .key(key)
            .upload_id(id)
            .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
            .set_if_none_match(if_absent.then(|| "*".to_owned()))
            .send()
            .await;
        put_result("CompleteMultipartUpload", rel, done)
    }
}

impl ObjectStore for S3Store {
    fn describe(&self) -> String {
        format!("s3://{}/{}", self.url.bucket, self.url.prefix)
    }

    async fn head(&self, rel: &str) -> Result<Option<Remote>, StoreError> {
        let got = self.client.head_object().bucket(&self.url.bucket).key(self.url.key(rel)).send().await;
        match got {
            Ok(o) => Ok(Some(Remote {
                len: o.content_length().and_then(|l| u64::try_from(l).ok()).unwrap_or(0),
                etag: o.e_tag().map(|t| t.trim_matches('"').to_owned()),
            })),
            Err(SdkError::ServiceError(e)) if e.err().is_not_found() => Ok(None),
            Err(e) => Err(classify("HeadObject", rel, &e)),
        }
    }

    async fn put_file(
        &self,
        rel: &str,
        file: &std::fs::File,
        len: u64,
        if_absent: bool,
    ) -> Result<Put, StoreError> {
        let key = self.url.key(rel);
        if len > self.options.multipart_threshold {
            return self.put_multipart(rel, &key, file, len, if_absent).await;
        }
        let body = file_body(file, 0, len, "PutObject", rel).await?;
        let done = self
            .client
            .put_object()
            .bucket(&self.url.bucket)
            .key(&key)
            .body(body)
            .set_if_none_match(if_absent.then(|| "*".to_owned()))
            .send()
            .await;
        put_result("PutObject", rel, done)
    }
}

/// A put's reply: 412 Precondition Failed means `If-None-Match: *` found the key taken.
fn put_result<T, E>(
    op: &'static str,
    rel: &str,
    reply: Result<T, SdkError<E, HttpResponse>>,
) -> Result<Put, StoreError>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match reply {
        Ok(_) => Ok(Put::Stored),
        Err(SdkError::ServiceError(e)) if e.raw().status().as_u16() == 412 => Ok(Put::Exists),
        Err(e) => Err(classify(op, rel, &e)),
    }
}

/// `len` bytes of the open file from `offset`, streamed (never the whole file in memory).
/// From the descriptor the uploader opened, not from a path: the name may have been
/// swapped for a link since (`docs/on-disk.md`). Such a body cannot be replayed, which the
/// SDK does not need: its own retries are off.
async fn file_body(
    file: &std::fs::File,
    offset: u64,
    len: u64,
    op: &'static str,
    rel: &str,
) -> Result<ByteStream, StoreError> {
    let io = |e: std::io::Error| store_error(ErrorClass::Retry, "io", op, rel, &e.to_string());
    let file = tokio::fs::File::from_std(file.try_clone().map_err(io)?);
    ByteStream::read_from()
        .file(file)
        .offset(offset)
        .length(Length::Exact(len))
        .build()
        .await
        .map_err(|e| store_error(ErrorClass::Retry, "io", op, rel, &e.to_string()))
}

fn store_error(class: ErrorClass, code: &str, op: &'static str, key: &str, detail: &str) -> StoreError {
    StoreError {
        class,
        code: code.to_owned(),
        op,
        key: key.to_owned(),
        detail: detail.to_owned(),
        file_only: false,
    }
}

/// Error codes after which the same request keeps failing until someone acts.
const FATAL_CODES: &[&str] = &[
    "AccessDenied",
    "AllAccessDisabled",
    "AccountProblem",
    "AuthorizationHeaderMalformed",
    "InvalidAccessKeyId",
    "InvalidBucketName",
    "InvalidToken",
    "NoSuchBucket",
    "PermanentRedirect",
    "SignatureDoesNotMatch",
];

/// 4xx codes that a later attempt can get past (a token being refreshed, a conflicting
/// operation, a body cut in transit).
const RETRY_CODES: &[&str] =
    &["ExpiredToken", "OperationAborted", "NoSuchUpload", "IncompleteBody", "BadDigest", "RequestTimeout"];

const THROTTLE_CODES: &[&str] =
    &["SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"];

/// Sorts an SDK error into retry / throttled / fatal.
pub fn classify<E>(op: &'static str, key: &str, err: &SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let detail = chain(err);
    let mut file_only = false;
    let (class, code) = match err {
        SdkError::ServiceError(ctx) => {
            let code = ctx.err().code().unwrap_or("").to_owned();
            let status = ctx.raw().status().as_u16();
            let class = classify_service(&code, status);
            // A refusal that is not about the bucket or the credentials is about this key.
            file_only = class == ErrorClass::Fatal
                && !FATAL_CODES.contains(&code.as_str())
                && !matches!(status, 301 | 401 | 403 | 404);
            (class, if code.is_empty() { format!("HTTP {status}") } else { code })
        }
        SdkError::TimeoutError(_) => (ErrorClass::Retry, "timeout".to_owned()),
        SdkError::DispatchFailure(d) if d.is_timeout() => (ErrorClass::Retry, "timeout".to_owned()),
        SdkError::DispatchFailure(d) if d.is_io() => (ErrorClass::Retry, "connection".to_owned()),
        // No credentials from any source of the chain: reported once, probed.
        SdkError::DispatchFailure(_) if detail.contains("no credentials") => {
            (ErrorClass::Fatal, NO_CREDENTIALS.to_owned())
        }
        // Other credential failures (a profile that cannot be read, a provider error).
        SdkError::DispatchFailure(_) if detail.contains("credential") => {
            (ErrorClass::Fatal, "credentials".to_owned())
        }
        SdkError::DispatchFailure(_) => (ErrorClass::Retry, "dispatch".to_owned()),
        SdkError::ResponseError(_) => (ErrorClass::Retry, "response".to_owned()),
        // No credentials, a bad endpoint: nothing a retry changes by itself.
        SdkError::ConstructionFailure(_) => (ErrorClass::Fatal, "request".to_owned()),
        _ => (ErrorClass::Retry, "unknown".to_owned()),
    };
    StoreError { class, code, op, key: key.to_owned(), detail, file_only }
}

/// An error and its sources, `: `-separated, each said once (the SDK's wrappers repeat
/// their source's text), on one line (the credential chain lists its providers on lines
/// of their own).
pub(crate) fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let text =
            e.to_string().split('\n').map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ");
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

/// The class of an error reply: by code first, then by HTTP status.
pub fn classify_service(code: &str, status: u16) -> ErrorClass {
    if THROTTLE_CODES.contains(&code) || status == 429 || status == 503 {
        ErrorClass::Throttled
    } else if FATAL_CODES.contains(&code) || status == 401 || status == 403 {
        ErrorClass::Fatal
    } else if status >= 500 || status == 0 || RETRY_CODES.contains(&code) || code == "RequestTimeTooSkewed" {
        ErrorClass::Retry
    } else {
        // Another 4xx: this request is wrong and sending it again will not fix it.
        ErrorClass::Fatal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls_split_into_bucket_and_prefix() {
        let u = S3Url::parse("s3://b/some/prefix/").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("b", "some/prefix"));
        assert_eq!(u.key("system/x.json"), "some/prefix/system/x.json");
        let bare = S3Url::parse("s3://b").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bare.key("system/x.json"), "system/x.json");
        assert_eq!(S3Url::parse("https://b/p"), Err(S3UrlError::NotS3("https://b/p".into())));
        assert_eq!(S3Url::parse("s3:///p").unwrap_err().to_string(), r#""s3:///p" names no bucket"#);
    }

    #[test]
    fn service_errors_are_classified_by_code_then_status() {
        assert_eq!(classify_service("NoSuchBucket", 404), ErrorClass::Fatal);
        assert_eq!(classify_service("AccessDenied", 403), ErrorClass::Fatal);
        assert_eq!(classify_service("", 403), ErrorClass::Fatal);
        assert_eq!(classify_service("SlowDown", 503), ErrorClass::Throttled);
        assert_eq!(classify_service("", 429), ErrorClass::Throttled);
        assert_eq!(classify_service("InternalError", 500), ErrorClass::Retry);
        assert_eq!(classify_service("RequestTimeout", 400), ErrorClass::Retry);
        assert_eq!(classify_service("EntityTooLarge", 400), ErrorClass::Fatal);
        assert_eq!(classify_service("ExpiredToken", 400), ErrorClass::Retry);
        assert_eq!(classify_service("OperationAborted", 409), ErrorClass::Retry);
    }
}
