//! The output tree under `LocalPath`, shared by the agent and the hook so that their file
//! names cannot drift (docs/formats.md, "System files: names", "Timeline files"):
//!
//! ```text
//! system/incremental/<YYYYMMDDHH>/<epoch_s>.algo-<n>.json            agent, one per minute
//! framework/pevents/<YYYYMMDDHH>/<end_us>_<node>_pythontimeline.json hook, rotated
//! system/training_job_end.ts, framework/training_job_end.ts           agent, at the end
//! ```
//!
//! Hour folders are always the UTC hour of the time in the file name. The names, the
//! temporary names and their parsing are pure functions here; [`fs`] holds the file calls
//! (never through a link, never replacing a file), [`ledger`] the agent's records in
//! `.trainprof/`, [`node`] the two node names (`algo-<n>`, `<rank>-<host>`), [`protocol`] the
//! words and lines inside the files (the metric and event vocabulary, the system-line codec). `docs/on-disk.md` describes the whole protocol.

use std::fmt;

pub mod fs;
pub mod ledger;
pub mod node;
pub mod protocol;
pub mod text;

/// A UTC calendar time, to the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcTime {
    pub year: i64,
    pub month: u8,
    pub day: u8,
    pub hour: u8,
    pub minute: u8,
    pub second: u8,
}

impl UtcTime {
    /// The calendar time of `epoch_s` seconds since 1970-01-01T00:00:00Z (proleptic
    /// Gregorian, no leap seconds: what `gmtime` gives).
    pub fn from_epoch_s(epoch_s: i64) -> UtcTime {
        let days = epoch_s.div_euclid(86_400);
        let secs = epoch_s.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        // secs < 86_400, so each part fits a u8.
        let [hour, minute, second] = [secs / 3600, secs % 3600 / 60, secs % 60].map(|v| v as u8);
        UtcTime { year, month, day, hour, minute, second }
    }

    /// `YYYYMMDDHH`, the hour-folder name.
    pub fn hour_dir(&self) -> String {
        format!("{:04}{:02}{:02}{:02}", self.year, self.month, self.day, self.hour)
    }
}

/// `2026-11-22T10:05:00Z`.
impl fmt::Display for UtcTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

/// Days since 1970-01-01 -> (year, month, day). Howard Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u8, u8) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8; // [1, 31]
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8; // [1, 12]
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `system/incremental/<hour>/<epoch_s>.algo-<n>.json` for the window starting at
/// `window_start_s` (smdebug's readers need exactly 10 digits: years 2001–2286).
pub fn system_file(window_start_s: i64, algo_n: u32) -> String {
    let hour = UtcTime::from_epoch_s(window_start_s).hour_dir();
    format!("system/incremental/{hour}/{window_start_s}.algo-{algo_n}.json")
}

/// `framework/pevents/<hour>/<end_us>_<node>_<suffix>`, named by the largest event end
/// time inside (µs since the epoch).
pub fn timeline_file(end_us: i64, node_id: &str, suffix: &str) -> String {
    let hour = UtcTime::from_epoch_s(end_us.div_euclid(1_000_000)).hour_dir();
    format!("framework/pevents/{hour}/{end_us}_{node_id}_{suffix}")
}

/// The suffix of the files the hook writes.
pub const PYTHON_TIMELINE_SUFFIX: &str = "pythontimeline.json";

/// The end-of-job markers smdebug's `ProfilerTrial` waits for (docs/formats.md, "End-of-job markers").
pub const END_MARKERS: [&str; 2] = ["system/training_job_end.ts", "framework/training_job_end.ts"];

/// The temporary name of a system file being written: `.<window s>.algo-<n>.<tag>.tmp`
/// in `system/` (hidden and without `.json`, so that no smdebug reader lists it). `tag`
/// keeps writers apart (the agent's pid).
pub fn system_temp(window_s: i64, algo_n: u32, tag: &str) -> String {
    format!(".{window_s}.algo-{algo_n}.{tag}.tmp")
}

/// `(window s, n)` of a [`system_temp`] name.
pub fn parse_system_temp(name: &str) -> Option<(i64, u32)> {
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (window, rest) = rest.split_once('.')?;
    let (n, tag) = rest.strip_prefix("algo-")?.split_once('.')?;
    if tag.is_empty() || window.is_empty() || !window.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((window.parse().ok()?, n.parse().ok()?))
}

/// The temporary name of a timeline being written, in `framework/`:
/// `<node>_pythontimeline.json.<tag>.tmp`; `tag` makes it unique (the writer's pid and a
/// sequence number), so a writer always creates a new file and never meets a leftover.
pub fn timeline_temp(node_id: &str, tag: &str) -> String {
    format!("{node_id}_{PYTHON_TIMELINE_SUFFIX}.{tag}.tmp")
}

/// The node of a timeline temporary name: [`timeline_temp`], or the `<node>_pythontimeline
/// .json.tmp` of earlier versions.
pub fn parse_timeline_temp(name: &str) -> Option<&str> {
    let rest = name.strip_suffix(".tmp")?;
    let suffix = format!("_{PYTHON_TIMELINE_SUFFIX}");
    let at = rest.find(&suffix)?;
    let (node, after) = (&rest[..at], &rest[at + suffix.len()..]);
    let known = after.is_empty() || after.strip_prefix('.').is_some_and(|a| !a.is_empty());
    (known && !node.is_empty() && !node.starts_with('.')).then_some(node)
}

/// The candidate names of a timeline whose last event ends at `end_us`: that time, then
/// each microsecond after it (names must be unique; a later one is still a valid end for
/// the readers).
pub fn timeline_names(end_us: i64, node_id: &str) -> impl Iterator<Item = String> + '_ {
    (0..TIMELINE_NAME_TRIES)
        .map(move |i| timeline_file(end_us.saturating_add(i), node_id, PYTHON_TIMELINE_SUFFIX))
}

/// How many microseconds a timeline's name is raised at most while names are taken.
pub const TIMELINE_NAME_TRIES: i64 = 10_000;

/// The candidate names of a system file: `first` (a window start) and then the second of
/// its first line and each second before it, for a minute (see [`system_first_names`]).
pub fn system_names(first: Option<i64>, first_line_s: i64, algo_n: u32) -> impl Iterator<Item = String> {
    first.into_iter().chain(system_first_names(first_line_s)).map(move |s| system_file(s, algo_n))
}

/// The window starts a writer's first file (or a repaired one) may take: the second of
/// its first line, then each second before it, for a minute. Not the minute first: an
/// earlier agent may have sealed, uploaded and deleted that name (a restart), and agents
/// restarted within one second still find a free name. A name only has to be ≤ every line
/// in the file (the readers look 180 s around a query), so it may lie before the minute.
pub fn system_first_names(first_line_s: i64) -> impl Iterator<Item = i64> {
    (first_line_s.saturating_sub(60)..=first_line_s).rev()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_calendar() {
        assert_eq!(UtcTime::from_epoch_s(0).to_string(), "1970-01-01T00:00:00Z");
        // From the spec: 1595455620 is 2020-07-22T22:07:00Z.
        assert_eq!(UtcTime::from_epoch_s(1_595_455_620).to_string(), "2020-07-22T22:07:00Z");
        assert_eq!(UtcTime::from_epoch_s(951_782_400).to_string(), "2000-02-29T00:00:00Z");
        assert_eq!(UtcTime::from_epoch_s(4_107_542_399).to_string(), "2100-02-28T23:59:59Z");
        assert_eq!(UtcTime::from_epoch_s(-1).to_string(), "1969-12-31T23:59:59Z");
        assert_eq!(UtcTime::from_epoch_s(1_795_316_901).hour_dir(), "2026112203");
    }

    #[test]
    fn paths() {
        assert_eq!(system_file(1_595_455_620, 1), "system/incremental/2020072222/1595455620.algo-1.json");
        assert_eq!(
            timeline_file(1_795_316_901_809_988, "29945-vm", PYTHON_TIMELINE_SUFFIX),
            "framework/pevents/2026112203/1795316901809988_29945-vm_pythontimeline.json"
        );
    }

    #[test]
    fn temporary_names_round_trip() {
        let n = system_temp(1_595_455_620, 3, "77");
        assert_eq!(n, ".1595455620.algo-3.77.tmp");
        assert_eq!(parse_system_temp(&n), Some((1_595_455_620, 3)));
        for bad in
            [".1595455620.algo-3.tmp", "1595455620.algo-3.7.tmp", ".x.algo-3.7.tmp", ".1.algo-3.7.json"]
        {
            assert_eq!(parse_system_temp(bad), None, "{bad}");
        }
        let t = timeline_temp("0-algo-1", "42-0");
        assert_eq!(t, "0-algo-1_pythontimeline.json.42-0.tmp");
        assert_eq!(parse_timeline_temp(&t), Some("0-algo-1"));
        assert_eq!(parse_timeline_temp("0-algo-1_pythontimeline.json.tmp"), Some("0-algo-1"));
        for bad in [
            "_pythontimeline.json.tmp",
            ".x_pythontimeline.json.tmp",
            "x_pythontimeline.json..tmp",
            "x.json.tmp",
        ] {
            assert_eq!(parse_timeline_temp(bad), None, "{bad}");
        }
        let names: Vec<_> = timeline_names(5, "n").take(2).collect();
        assert_eq!(
            names,
            [
                "framework/pevents/1970010100/5_n_pythontimeline.json",
                "framework/pevents/1970010100/6_n_pythontimeline.json"
            ]
        );
        let sys: Vec<_> = system_names(Some(120), 130, 1).take(3).collect();
        assert_eq!(
            sys,
            [
                "system/incremental/1970010100/120.algo-1.json",
                "system/incremental/1970010100/130.algo-1.json",
                "system/incremental/1970010100/129.algo-1.json"
            ]
        );
        assert_eq!(system_first_names(130).count(), 61);
    }
}
