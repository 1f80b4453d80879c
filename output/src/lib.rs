//! The output tree under `LocalPath`, shared by the agent and the hook so that their file
//! names cannot drift (spec §2.1, §3.1, §3.2):
//!
//! ```text
//! system/incremental/<YYYYMMDDHH>/<epoch_s>.algo-<n>.json            agent, one per minute
//! framework/pevents/<YYYYMMDDHH>/<end_us>_<node>_pythontimeline.json hook, rotated
//! system/training_job_end.ts, framework/training_job_end.ts           agent, at the end
//! ```
//!
//! Hour folders are always the UTC hour of the time in the file name. Everything here is
//! a pure function; the writers that use it come with the agent and the hook.

use std::fmt;

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

/// The end-of-job markers smdebug's `ProfilerTrial` waits for (spec §2.4).
pub const END_MARKERS: [&str; 2] = ["system/training_job_end.ts", "framework/training_job_end.ts"];

/// A node id for file names: readers split names on `_`, so every `_` becomes `-` (as
/// smdebug does), and `/` (which would make a folder) too.
pub fn node_id(rank: u64, host: &str) -> String {
    format!("{rank}-{host}").replace(['_', '/'], "-")
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
    fn node_ids_have_no_underscores() {
        assert_eq!(node_id(0, "algo-1"), "0-algo-1");
        assert_eq!(node_id(905, "b88a_bb/x"), "905-b88a-bb-x");
    }
}
