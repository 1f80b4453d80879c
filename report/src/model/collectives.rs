//! Collectives matched across ranks, and the nodes' clocks aligned from them, as the report
//! holds them (`docs/report.md`, "Collectives across ranks"): `analysis/collectives.rs`
//! computes them from the detailed windows' events.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use super::kinds::{AlignState, MatchedBy};

/// `collectives` in the model.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Collectives {
    pub matched_by: MatchedBy,
    /// Ranks with collectives read.
    pub ranks: u64,
    /// Collectives read, summed over the ranks.
    pub records: u64,
    /// Collectives matched on two ranks or more.
    pub matched: u64,
    /// Collectives seen on one rank only.
    pub unmatched: u64,
    /// Communication kernels (`ncclKernel_*`, `ncclDevKernel_*`) read.
    pub kernels: u64,
    /// Arrival spread (last arrival − first) over the matched collectives, ms.
    pub arrival_spread_ms: Spread,
    /// End spread (last end − first), aligned, over the matched collectives with ends, ms.
    pub end_spread_ms: Spread,
    /// Per rank, in rank order.
    pub per_rank: Vec<CollectiveRank>,
    /// The matched collectives with the largest arrival spread, largest first.
    pub widest: Vec<Collective>,
    /// One rank last at most collectives; `null` when none is.
    pub late_rank: Option<LateRank>,
    /// Per node (the host of `<rank>-<host>`): its clock as the collectives align it.
    pub clocks: Vec<NodeClock>,
    /// The page's chart: each matched collective's first arrival (epoch s, aligned) and
    /// arrival spread (ms), at most [`CHART_POINTS`] (the largest spread of each slice).
    pub chart: Vec<[f64; 2]>,
}

/// Points of `collectives.chart`.
pub const CHART_POINTS: usize = 2000;

/// Quantiles of a spread, ms; `null` without data.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Spread {
    pub count: u64,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CollectiveRank {
    pub rank: String,
    /// Its node: the host of `<rank>-<host>`.
    pub node: String,
    /// Collectives read on this rank, and those matched with another rank.
    pub collectives: u64,
    pub matched: u64,
    /// Matched collectives it arrived last at, and their share of `matched`.
    pub last: u64,
    pub last_share: Option<f64>,
    /// The time the other ranks waited for it: over the collectives it arrived last at, the
    /// sum of (its arrival − each other rank's arrival), ms.
    pub others_waited_ms: f64,
    /// The time it waited for the last rank: over its matched collectives, the sum of (the
    /// last arrival − its arrival), ms.
    pub waited_ms: f64,
}

/// One matched collective.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Collective {
    /// The process group (`""` when the events do not say).
    pub group: String,
    /// Its sequence number (`seq`), or its place in the group's calls of its step (`order`).
    pub seq: i64,
    pub step: i64,
    /// `allreduce`, `allgather`, … (lower case, without underscores).
    pub kind: String,
    /// The message's bytes: `In msg nelems` × the size of `dtype`, else what `trainprof.torch`
    /// wrote from torch's recorded shapes (`msg_bytes`), when recorded.
    pub bytes: Option<u64>,
    /// Its element type, c10's `ScalarType` name (`Float`, `BFloat16`, …), when recorded.
    pub dtype: Option<String>,
    pub group_size: Option<u64>,
    pub ranks: u64,
    /// The first arrival, epoch s (aligned).
    pub start_s: f64,
    pub arrival_spread_ms: f64,
    /// Aligned; `null` with fewer than two ends.
    pub end_spread_ms: Option<f64>,
    pub first_rank: String,
    pub last_rank: String,
}

/// The finding: one rank arrives last at most collectives.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LateRank {
    pub rank: String,
    pub last: u64,
    pub matched: u64,
    pub last_share: f64,
    pub others_waited_ms: f64,
    pub summary: String,
}

/// A node's clock.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NodeClock {
    pub node: String,
    pub state: AlignState,
    /// Subtracted from its times: median over the shared collectives of (its end − the
    /// reference node's end), ms; 0 for the reference, `null` unaligned.
    pub offset_ms: Option<f64>,
    /// The offset's standard error: 1.2533 × 1.4826 × MAD / √n, ms; `null` unaligned.
    pub uncertainty_ms: Option<f64>,
    /// The median absolute deviation of the per-collective differences, ms.
    pub mad_ms: Option<f64>,
    /// Collectives shared with the reference node that the estimate rests on.
    pub collectives: u64,
    /// Why unaligned; `null` otherwise.
    pub reason: Option<String>,
    /// The nodes' recorded clock error bounds summed (`job.clock`: this node's and the
    /// reference's `max_error_us`, both synchronised), ms; `null` without them.
    pub bound_ms: Option<f64>,
    /// Whether |offset| − uncertainty is within `bound_ms`; `null` without a bound.
    pub within_bound: Option<bool>,
}

/// `nccl_inspector` in the model: NCCL Inspector's per-process records of the job's
/// collectives (`docs/report.md`, "NCCL Inspector"); left out without Inspector files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Inspector {
    /// Files read (one per process) and records (collectives) taken from them.
    pub files: u64,
    pub records: u64,
    /// Records skipped: not JSON, not Inspector's shape, too long or cut.
    pub bad_records: u64,
    /// Communicators, by id: their size and the processes whose files hold them.
    pub communicators: Vec<InspectorComm>,
    /// Collectives (communicator id, `coll_sn`) seen on two processes or more.
    pub matched: u64,
    /// Over the matched collectives: the longest execution time less the shortest, ms.
    pub exec_spread_ms: Spread,
    /// One row per process (file), by host and pid.
    pub per_rank: Vec<InspectorRank>,
    /// The process with the most GPU time over the matched collectives; `null` with fewer
    /// than two processes sharing collectives.
    pub slowest: Option<InspectorSlowest>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InspectorComm {
    pub id: String,
    /// `header.n_ranks`.
    pub n_ranks: i64,
    /// Processes whose files hold it.
    pub processes: u64,
    pub records: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InspectorRank {
    pub host: String,
    pub pid: Option<u64>,
    /// Its `header.rank` in the largest communicator it is in.
    pub rank: Option<i64>,
    pub collectives: u64,
    /// Collectives by kind (`AllReduce`, `AllGather`, …).
    pub kinds: BTreeMap<String, u64>,
    /// `coll_msg_size_bytes` summed.
    pub bytes: u64,
    /// `coll_exec_time_us` summed, ms.
    pub gpu_time_ms: f64,
    /// The mean of `coll_busbw_gbs` over its collectives that have one.
    pub mean_busbw_gbs: Option<f64>,
    /// Its collectives seen on another process too, and their execution time summed, ms.
    pub matched: u64,
    pub matched_gpu_time_ms: f64,
    /// Matched collectives where its execution time was the longest, and the shortest.
    pub longest: u64,
    pub shortest: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InspectorSlowest {
    pub host: String,
    pub pid: Option<u64>,
    pub rank: Option<i64>,
    pub matched_gpu_time_ms: f64,
    /// The median of the processes' `matched_gpu_time_ms`.
    pub median_ms: f64,
    pub longest: u64,
    pub matched: u64,
    pub summary: String,
}
