//! S3, for the uploader and the commands that read a job from S3 (`report`, `trace`,
//! `compare`, the page at the end of `run --s3`): the client and the store ([`store`]: the
//! client made once, with the credential chain, the endpoint and path-style addressing) and
//! the download of a job's files ([`download`]). The S3 client is the agent's async code:
//! it runs on a tokio runtime ([`runtime`] for the commands, the uploader's own thread).

pub mod download;
pub mod small;
pub mod store;

/// The runtime for a command's S3 requests could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the S3 client: {0}")]
pub struct RuntimeError(#[source] std::io::Error);

/// A single-threaded runtime for one command's S3 requests.
pub fn runtime() -> Result<tokio::runtime::Runtime, RuntimeError> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(RuntimeError)
}
