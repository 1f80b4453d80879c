//! PyTorch memory snapshots (docs/formats.md, "Memory snapshots"): the folder and the file
//! names a PyTorch memory window or OOM writes and the report reads
//! (`report/src/reading/memory.rs`). The file is torch's own pickle
//! (`torch.cuda.memory._dump_snapshot`), which pytorch.org/memory_viz opens as it is.

/// The folder of the snapshots, relative to LocalPath; a node's are in `<MEMORY_DIR>/<node>/`.
pub const MEMORY_DIR: &str = "framework/memory";
/// The files' extension.
pub const EXTENSION: &str = ".pickle";
/// A memory window's snapshot: `window-<first step>-<last step>-<µs>.pickle`.
pub const WINDOW: &str = "window";
/// The snapshot at a rank's first out-of-memory error: `oom-<step>-<µs>.pickle`.
pub const OOM: &str = "oom";

/// Why a snapshot was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SnapshotKind {
    Window,
    Oom,
}

impl SnapshotKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Window => WINDOW,
            SnapshotKind::Oom => OOM,
        }
    }
}

/// A snapshot file's name, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotName {
    pub kind: SnapshotKind,
    pub first_step: i64,
    /// The window's last step; the OOM's step for an OOM snapshot.
    pub last_step: i64,
    /// When it was written, µs since the epoch.
    pub us: u64,
}

impl SnapshotName {
    /// `window-3-5-1795316597979670.pickle`, `oom-7-1795316597979670.pickle`; `None` for any
    /// other name.
    pub fn parse(name: &str) -> Option<SnapshotName> {
        let stem = name.strip_suffix(EXTENSION)?;
        let mut parts = stem.split('-');
        let kind = match parts.next()? {
            WINDOW => SnapshotKind::Window,
            OOM => SnapshotKind::Oom,
            _ => return None,
        };
        fn num<T: std::str::FromStr>(s: Option<&str>) -> Option<T> {
            s.filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))?.parse().ok()
        }
        let first_step: i64 = num(parts.next())?;
        let last_step: i64 = if kind == SnapshotKind::Window { num(parts.next())? } else { first_step };
        let us: u64 = num(parts.next())?;
        (parts.next().is_none() && last_step >= first_step).then_some(SnapshotName {
            kind,
            first_step,
            last_step,
            us,
        })
    }

    pub fn file_name(&self) -> String {
        match self.kind {
            SnapshotKind::Window => {
                format!("{WINDOW}-{}-{}-{}{EXTENSION}", self.first_step, self.last_step, self.us)
            }
            SnapshotKind::Oom => format!("{OOM}-{}-{}{EXTENSION}", self.first_step, self.us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_refused() {
        for n in ["window-3-5-1795316597979670.pickle", "oom-7-1795316597979670.pickle"] {
            assert_eq!(SnapshotName::parse(n).unwrap().file_name(), n);
        }
        for n in [
            "window-5-3-1.pickle",
            "oom-1-2-3.pickle",
            "window-1-2.pickle",
            "oom--1-2.pickle",
            "x-1-2.pickle",
            "oom-1-2.pkl",
            "oom-+1-2.pickle",
        ] {
            assert_eq!(SnapshotName::parse(n), None, "{n}");
        }
    }
}
