//! The `trainprof` binary's library: everything but argument parsing lives here so that
//! it can be tested without spawning the binary.
//!
//! Today it holds `config check`; the samplers (`sample/`), the uploader (`upload/`) and
//! `trainprof run` (`launch.rs`) build on the same configuration.

pub mod check;
