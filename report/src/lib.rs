//! `trainprof report`, `trainprof trace` and `trainprof compare`: one pass over a LocalPath
//! (system files, timelines, Python-stats windows, native profiles, dumps;
//! `docs/formats.md`) into a [`model::ReportModel`] (statistics and the eleven findings,
//! `docs/report.md`), an HTML page ([`page::render`]), a Perfetto trace ([`trace::write`]),
//! or a comparison of two runs ([`compare`]). Every file is read through
//! `trainprof_output::fs`: the report runs as root at the end of `trainprof run`, on a folder
//! the trainer's user could write.
//!
//! The crate is in layers; a module imports only from its own layer or the ones below it
//! (ARCHITECTURE.md, "The report crate"):
//!
//! | layer | where | what |
//! |---|---|---|
//! | vocabulary | [`model`] | what every output is made from; imports nothing from the crate |
//! | reading | [`reading`] | one module per format (timelines, system lines, cProfile, pyinstrument, native profiles, dumps, node record) and the shared bounded reads and text helpers |
//! | analysis | [`analysis`] | the one-pass aggregates, steps, detailed windows, fleet, incidents, statistics |
//! | rules | [`rules`] | the eleven findings, each rule in its own file |
//! | job | [`build`], [`build_with`] (`job.rs`) | one pass: reading → analysis → rules → model |
//! | outputs | [`page`], [`trace`], [`compare`] | the HTML page (one module per section, `page/markup.rs` for the common HTML), the Perfetto trace, two runs compared |

pub mod analysis;
pub mod compare;
mod job;

pub mod model;
pub mod page;
pub mod reading;
pub mod rules;
pub mod trace;

pub use job::{Error, Raw, build, build_with, to_json};
pub use reading::job_files;
pub use rules::Options;
