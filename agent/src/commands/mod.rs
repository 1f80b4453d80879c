//! The commands a user runs (`main.rs` parses the flags and calls one of them).

pub mod check;
pub mod compare;
pub mod report;
pub mod run;
pub mod trigger;
