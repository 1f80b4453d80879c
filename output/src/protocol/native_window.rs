//! The native profiler's window folders (`docs/formats.md`, "Native profiling"):
//! `framework/native/<node>/<first µs>-<last µs>_<pid>`, written by the hook
//! (`hook-ffi/src/native.rs`) and read by the report, and the files in them.

use serde::{Deserialize, Serialize};

use crate::protocol::timeline_event::plausible_us;

/// The folder of the windows, relative to LocalPath.
pub const NATIVE_DIR: &str = "framework/native";

words! {
    /// The files of a window folder.
    FILES;
    /// The pprof profile (gzipped protobuf): every sample and stack.
    PROFILE_FILE = "profile.pb.gz",
    /// inferno's flame graph: written next to the profile when it could be drawn.
    FLAMEGRAPH_FILE = "flamegraph.svg",
}

/// One of a window folder's [`FILES`], serialised as its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum NativeFile {
    #[default]
    #[serde(rename = "profile.pb.gz")]
    Profile,
    #[serde(rename = "flamegraph.svg")]
    Flamegraph,
}

impl NativeFile {
    pub const ALL: [NativeFile; 2] = [NativeFile::Profile, NativeFile::Flamegraph];

    pub fn as_str(self) -> &'static str {
        match self {
            NativeFile::Profile => PROFILE_FILE,
            NativeFile::Flamegraph => FLAMEGRAPH_FILE,
        }
    }

    /// The file called `name`, if it is one of [`FILES`].
    pub fn parse(name: &str) -> Option<NativeFile> {
        NativeFile::ALL.into_iter().find(|f| f.as_str() == name)
    }
}

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

    #[test]
    fn files_are_their_names() {
        for f in NativeFile::ALL {
            assert_eq!(serde_json::to_value(f).unwrap(), serde_json::Value::from(f.as_str()));
            assert_eq!(NativeFile::parse(f.as_str()), Some(f));
        }
        assert_eq!(NativeFile::ALL.map(NativeFile::as_str), FILES);
        assert_eq!(NativeFile::parse("profile.pb"), None);
    }
}
