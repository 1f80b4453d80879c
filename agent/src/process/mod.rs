//! Process plumbing of `trainprof run`: CMD in its own process group, with the terminal
//! and the file limit it should have, and the signals `run` takes and passes on to it.

pub mod child;
pub mod signals;
