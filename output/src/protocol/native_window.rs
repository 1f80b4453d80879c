//! The native profiler's window folders (`docs/formats.md`, "Native profiling"):
//! `framework/native/<node>/<first µs>-<last µs>_<pid>`, written by the hook
//! (`hook-ffi/src/native.rs`) and read by the report.

use crate::protocol::timeline_event::plausible_us;

/// The folder of the windows, relative to LocalPath.
pub const NATIVE_DIR: &str = "framework/native";

/// `<first µs>-<last µs>_<pid>`: unique per process and window.
pub fn window_name(start_us: i64, end_us: i64, pid: u32) -> String {
    format!("{start_us}-{end_us}_{pid}")
}

/// `framework/native/<node>/<window>`, relative to LocalPath.
pub fn window_dir(node: &str, window: &str) -> String {
    format!("{NATIVE_DIR}/{node}/{window}")
}

/// `<first µs>-<last µs>_<pid>` → (first µs, last µs, pid), both times plausible.
pub fn parse_window(name: &str) -> Option<(i64, i64, u64)> {
    let (span, pid) = name.rsplit_once('_')?;
    let (a, b) = span.split_once('-')?;
    let (a, b): (i64, i64) = (a.parse().ok()?, b.parse().ok()?);
    (plausible_us(a) && plausible_us(b)).then_some((a, b, pid.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let (a, b) = (1_800_000_000_000_000, 1_800_000_001_000_000);
        assert_eq!(parse_window(&window_name(a, b, 42)), Some((a, b, 42)));
        assert_eq!(parse_window("1-2_3"), None);
        assert_eq!(window_dir("0-a", "w"), "framework/native/0-a/w");
    }
}
