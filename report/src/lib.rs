//! `trainprof report`: the report model and its offline HTML page (docs/report.md).

pub mod html;
pub mod model;
