//! The agent's log: one line per state change on stderr, `trainprof: <message>`, never one
//! per tick. (A tracing subscriber would cost more build time than this whole crate.)

use std::fmt;
use std::io::Write as _;

/// Writes one line; a closed stderr is ignored.
pub fn line(args: fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "trainprof: {args}");
}

/// `log!("cannot read {}: {e}", path.display())`
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => { $crate::log::line(format_args!($($arg)*)) };
}
