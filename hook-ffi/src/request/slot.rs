//! The request state the hook and its writer thread share (docs/formats.md, "On-demand
//! windows (`trainprof trigger`)"): what the writer asks of the next step boundary, what the
//! trainer took, and the armed window. A leaf: `hook.rs` holds these without importing the
//! poller, which works on the hook.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Mutex, PoisonError};

use trainprof_config::{AutoFeature, AutoFeatures, Config};

/// What the writer asks of the trainer's next step boundary.
#[derive(Debug, Clone)]
pub(crate) enum Ask {
    /// Phase one: say which step you are at.
    Ack,
    /// Phase two: arm `start..end` if you are still before `start`.
    Go { window: Requested },
}

/// What the trainer's thread took.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Taken {
    Step { step: u64, at_us: i64 },
    Armed { step: u64, files: Vec<String>, left_out: Vec<&'static str> },
    Missed { step: u64 },
}

#[derive(Debug, Default)]
pub(crate) struct SlotState {
    pub(super) ask: Option<Ask>,
    pub(super) taken: Option<Taken>,
}

/// The hand-over between the writer (asks) and the trainer's step boundary (takes).
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// An ask waits: the next `step_begin` takes it (with `try_lock`, never waiting).
    pub(crate) due: AtomicBool,
    /// A requested window is armed: each `step_begin` looks whether it opens or ends.
    pub(crate) armed: AtomicBool,
    pub(super) state: Mutex<SlotState>,
}

impl Slot {
    pub(super) fn put(&self, ask: Ask) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.ask = Some(ask);
        s.taken = None;
        self.due.store(true, Release);
    }

    /// Takes back an ask the trainer has not taken (the request expired).
    pub(super) fn withdraw(&self) -> Option<Taken> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.ask = None;
        self.due.store(false, Release);
        s.taken.take()
    }

    pub(super) fn taken(&self) -> Option<Taken> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).taken.take()
    }
}

/// An armed window: steps `start..end` of `features` (windows' numbering).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Requested {
    pub(crate) id: Arc<str>,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) features: AutoFeatures,
    pub(crate) requested_us: i64,
    /// Its instant event was written (at its first step).
    pub(crate) announced: bool,
}

impl Requested {
    pub(crate) fn opens(&self, feature: AutoFeature, step: u64) -> bool {
        self.features.contains(feature) && self.start <= step && step < self.end
    }

    pub(crate) fn contains(&self, step: u64) -> bool {
        self.start <= step && step < self.end
    }
}

/// Which of `features` may open under `config` (a feature whose own config is broken, or
/// off for model parallelism, does not: as for a triggered window), and where the files of
/// those that do go, under LocalPath.
pub(crate) fn openable(
    config: &Config,
    features: AutoFeatures,
    framework: &str,
    node: &str,
) -> (AutoFeatures, Vec<String>, Vec<&'static str>) {
    let mut open = AutoFeatures::default();
    let (mut files, mut left_out) = (Vec::new(), Vec::new());
    for f in features.iter() {
        let may = match f {
            AutoFeature::Detailed => config.detailed.may_auto_open(),
            AutoFeature::Dataloader => config.dataloader.feature.may_auto_open(),
            AutoFeature::Python => config.python.feature.may_auto_open(),
            AutoFeature::Native => config.native.feature.may_auto_open(),
            AutoFeature::Memory => config.memory.feature.may_auto_open(),
        };
        if !may {
            left_out.push(f.as_str());
            continue;
        }
        open.insert(f);
        let folder = match f {
            // The detailed and dataloader windows' events are timeline events.
            AutoFeature::Detailed | AutoFeature::Dataloader => "framework/pevents/".to_owned(),
            AutoFeature::Python => {
                format!("framework/{framework}/{}/{node}/", config.python.profiler.as_str())
            }
            AutoFeature::Native => {
                format!("{}/{node}/", trainprof_output::protocol::native_window::NATIVE_DIR)
            }
            AutoFeature::Memory => {
                format!("{}/{node}/", trainprof_output::protocol::memory_snapshot::MEMORY_DIR)
            }
        };
        if !files.contains(&folder) {
            files.push(folder);
        }
    }
    (open, files, left_out)
}
