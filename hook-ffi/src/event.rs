//! The fixed-size event that crosses the queue from the trainer's threads to the writer.
//!
//! It is plain data (no heap, no names): names travel as ids registered beforehand, so
//! building and queueing one never allocates.

use trainprof_config::{AutoFeature, AutoFeatures};

use crate::anomaly::Trigger;
use crate::types::{TRAINPROF_MAX_ARGS, TrainprofArg, TrainprofCap};

/// What an event is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A complete event (`ph: "X"`): everything the trainer records.
    Complete,
    /// The instant event of an anomaly trigger (`ph: "i"`, docs/formats.md, "Event
    /// vocabulary"); its numbers travel in the argument slots ([`Event::trigger`]).
    Trigger { features: u8 },
    /// The instant event of an on-demand window opening (`trainprof trigger`,
    /// docs/formats.md, "On-demand windows (`trainprof trigger`)"); its numbers travel in the
    /// argument slots ([`Event::requested`]).
    Requested { features: u8 },
    /// The instant event of a window that stopped at its cap (docs/formats.md, "Window
    /// caps"): `feature` indexes `AutoFeature::ALL`, `cap` is a `TrainprofCap`; its numbers
    /// travel in the argument slots ([`Event::capped`]).
    Capped { feature: u8, cap: u8 },
}

/// A queued event. Times are µs since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    pub phase: u32,
    pub name: u32,
    pub start_us: i64,
    pub end_us: i64,
    /// The step number for `args.step_num`, or [`NO_STEP`].
    pub step: i64,
    pub n_args: u8,
    pub args: [TrainprofArg; TRAINPROF_MAX_ARGS],
}

/// [`Event::step`] when the event belongs to no step (nothing began yet).
pub const NO_STEP: i64 = -1;

/// A trigger's numbers as the writer reads them back from an [`Event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TriggerInfo {
    pub step: u64,
    pub duration_us: i64,
    pub median_us: i64,
    pub num_steps: u64,
    pub features: AutoFeatures,
}

/// A capped window's numbers as the writer reads them back from an [`Event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CappedInfo {
    pub feature: AutoFeature,
    pub cap: TrainprofCap,
    /// The step the window stopped at, in the windows' numbering.
    pub step: u64,
    pub value: u64,
    pub limit: u64,
}

/// An on-demand window's numbers as the writer reads them back from an [`Event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestedInfo {
    pub window_start: u64,
    pub num_steps: u64,
    pub requested_us: i64,
    /// The request's id, a registered name.
    pub id_name: u32,
    pub features: AutoFeatures,
}

impl Event {
    pub fn args(&self) -> &[TrainprofArg] {
        match self.kind {
            Kind::Complete => &self.args[..usize::from(self.n_args).min(TRAINPROF_MAX_ARGS)],
            Kind::Trigger { .. } | Kind::Requested { .. } | Kind::Capped { .. } => &[],
        }
    }

    /// The instant event of a window that stopped at its cap, at `now_us`; `step_num` is the
    /// current step in its mode.
    pub fn capped(c: &CappedInfo, phase: u32, name: u32, step_num: i64, now_us: i64) -> Event {
        let slot = |value: i64| TrainprofArg { key: 0, kind: 0, value };
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let feature = AutoFeature::ALL.iter().position(|f| *f == c.feature).unwrap_or(0) as u8;
        Event {
            kind: Kind::Capped { feature, cap: c.cap as u8 },
            phase,
            name,
            start_us: now_us,
            end_us: now_us,
            step: step_num,
            n_args: 0,
            args: [slot(as_i64(c.step)), slot(as_i64(c.value)), slot(as_i64(c.limit)), slot(0)],
        }
    }

    /// What [`Event::capped`] put in, for such an event.
    pub fn capped_info(&self) -> Option<CappedInfo> {
        let Kind::Capped { feature, cap } = self.kind else { return None };
        let [step, value, limit, _] = self.args.map(|a| a.value);
        Some(CappedInfo {
            feature: *AutoFeature::ALL.get(usize::from(feature))?,
            cap: TrainprofCap::from_i32(i32::from(cap))?,
            step: step.unsigned_abs(),
            value: value.unsigned_abs(),
            limit: limit.unsigned_abs(),
        })
    }

    /// The instant event of an on-demand window opening at `now_us`, under phase `phase` and
    /// name `name`; `step_num` is the current step in its mode.
    pub fn requested(r: &RequestedInfo, phase: u32, name: u32, step_num: i64, now_us: i64) -> Event {
        let slot = |value: i64| TrainprofArg { key: 0, kind: 0, value };
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Event {
            kind: Kind::Requested { features: r.features.bits() },
            phase,
            name,
            start_us: now_us,
            end_us: now_us,
            step: step_num,
            n_args: 0,
            args: [
                slot(as_i64(r.window_start)),
                slot(as_i64(r.num_steps)),
                slot(r.requested_us),
                slot(i64::from(r.id_name)),
            ],
        }
    }

    /// What [`Event::requested`] put in, for such an event.
    pub fn requested_info(&self) -> Option<RequestedInfo> {
        let Kind::Requested { features } = self.kind else { return None };
        let [start, num, requested_us, id] = self.args.map(|a| a.value);
        Some(RequestedInfo {
            window_start: start.unsigned_abs(),
            num_steps: num.unsigned_abs(),
            requested_us,
            id_name: u32::try_from(id).unwrap_or(0),
            features: AutoFeatures::from_bits(features),
        })
    }

    /// The instant event of trigger `t`, at the slow step's end, under phase `phase` and
    /// name `name`; `step_num` is the slow step's number in its mode.
    pub fn trigger(t: &Trigger, phase: u32, name: u32, step_num: i64) -> Event {
        let slot = |value: i64| TrainprofArg { key: 0, kind: 0, value };
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Event {
            kind: Kind::Trigger { features: t.features.bits() },
            phase,
            name,
            start_us: t.end_us,
            end_us: t.end_us,
            step: step_num,
            n_args: 0,
            args: [slot(as_i64(t.step)), slot(t.duration_us), slot(t.median_us), slot(as_i64(t.num_steps))],
        }
    }

    /// What [`Event::trigger`] put in, for a trigger event.
    pub fn trigger_info(&self) -> Option<TriggerInfo> {
        let Kind::Trigger { features } = self.kind else { return None };
        let [step, duration, median, num] = self.args.map(|a| a.value);
        Some(TriggerInfo {
            step: step.unsigned_abs(),
            duration_us: duration,
            median_us: median,
            num_steps: num.unsigned_abs(),
            features: AutoFeatures::from_bits(features),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_stays_104_bytes() {
        assert_eq!(std::mem::size_of::<Event>(), 104);
    }
}
