//! Collectives matched across ranks, and each node's clock aligned from them
//! (`docs/report.md`, "Collectives across ranks"; the events: `docs/formats.md`,
//! "Collectives").
//!
//! While reading, each collective event of the detailed windows (torch's `c10d::*` call, a
//! backend's `gloo:*` / `nccl:*` range, `record_param_comms`, an NCCL kernel) is kept as a
//! small record, at most [`MAX_RECORDS`] per job, [`MAX_RANKS`] ranks and [`MAX_GROUPS`]
//! process groups: the rest is counted and said in `job.capped`. Once every file is read the
//! records are matched across ranks by (process group, sequence number), each node's clock
//! offset is estimated from the ends the nodes share, and the arrivals are compared on the
//! aligned times.

use std::collections::{BTreeMap, HashMap};

use crate::analysis::stats::quantile_sorted;
use crate::model::Capped;
use crate::model::collectives::*;
use crate::model::{Clock, ClockState};
use trainprof_output::protocol::timeline::collective as words;
use trainprof_output::protocol::timeline::{CPU_FUNCTIONS, GPU_FUNCTIONS};

/// Collective records kept per job (56 bytes each: 28 MB at most).
pub const MAX_RECORDS: usize = 500_000;
/// Ranks with collectives kept per job.
pub const MAX_RANKS: usize = 4096;
/// Distinct process groups kept per job; a group's name is cut to [`MAX_GROUP_BYTES`].
pub const MAX_GROUPS: usize = 256;
pub const MAX_GROUP_BYTES: usize = 64;
/// Distinct collective kinds kept, `other` among them (the further ones).
pub const MAX_KINDS: usize = 64;
const KIND_BYTES: usize = 32;
/// Collectives listed in `widest`.
pub const WIDEST: usize = 20;
/// Shared collectives an offset needs, and the most its differences may scatter (1.4826 ×
/// MAD, ms) for the estimate to be taken.
pub const MIN_SHARED: usize = 5;
pub const MAX_SCATTER_MS: f64 = 5.0;
/// A rank is named late when it arrived last at this share of its matched collectives (and
/// at 1.5 × the share chance would give), over at least [`MIN_LATE_COLLECTIVES`], and the
/// others waited for it at least [`MIN_LATE_WAIT_MS`] a collective it was last at (summed
/// over them).
pub const LATE_SHARE: f64 = 0.5;
pub const MIN_LATE_COLLECTIVES: u64 = 10;
pub const MIN_LATE_WAIT_MS: f64 = 1.0;

/// The collective kinds, as [`kind_of`] spells them (a name's letters and digits, lower case).
const KINDS: [&str; 9] = [
    "allreduce",
    "allgather",
    "reducescatter",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "alltoall",
    "barrier",
];

/// The kind of a collective from a name's tail (`allreduce_`, `all_reduce`,
/// `_allgather_base_`, `AllReduce`): its letters and digits, lower case, when they start
/// with a collective's; `None` for anything else (point-to-point `send`, `recv`, …).
pub fn kind_of(tail: &str) -> Option<String> {
    let k: String = tail
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(KIND_BYTES)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    KINDS.iter().any(|p| k.starts_with(p)).then_some(k)
}

/// The kind of an NCCL kernel (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`,
/// `ncclKernel_AllGather_RING_LL_Sum_int8_t`): the word after the prefix.
pub fn kernel_kind(name: &str) -> Option<String> {
    let rest = words::NCCL_KERNEL_PREFIXES.iter().find_map(|p| name.strip_prefix(p))?;
    kind_of(rest.split(['_', '(', ' ']).next().unwrap_or_default())
}

/// torch's element type by `record_param_comms`' `dtype` (c10's `ScalarType` name): its
/// place in [`words::SCALAR_TYPES`].
fn dtype_named(d: &str) -> Option<u8> {
    words::SCALAR_TYPES.iter().position(|t| t.0 == d).map(|i| i as u8)
}

/// torch's element type by its c10 `ScalarType` number (`scalar_type`): its place in
/// [`words::SCALAR_TYPES`].
fn dtype_numbered(n: i64) -> Option<u8> {
    words::SCALAR_TYPES.iter().position(|t| i64::from(t.1) == n).map(|i| i as u8)
}

const CALL: u8 = 0;
const BACKEND: u8 = 1;
const PARAM: u8 = 2;
const KERNEL: u8 = 3;
const NONE16: u16 = u16::MAX;
const NONE8: u8 = u8::MAX;

#[derive(Debug, Clone, Copy)]
struct Rec {
    start: i64,
    end: i64,
    step: i64,
    /// `i64::MIN`: not recorded.
    seq: i64,
    /// `-1`: not recorded.
    bytes: i64,
    /// The element type's place in [`words::SCALAR_TYPES`]; [`NONE8`]: not recorded.
    dtype: u8,
    group_size: i32,
    group: u16,
    kind: u16,
    family: u8,
    /// A backend range that is the collective's whole run (`gloo:*`).
    completes: bool,
}

#[derive(Debug, Default)]
struct Rank {
    recs: Vec<Rec>,
}

/// What is kept while reading.
#[derive(Debug, Default)]
pub struct Collector {
    ranks: Vec<(String, Rank)>,
    rank_ids: HashMap<String, usize>,
    groups: Vec<String>,
    group_ids: HashMap<String, u16>,
    kinds: Vec<String>,
    kind_ids: HashMap<String, u16>,
    records: usize,
    left_out_records: u64,
    left_out_ranks: u64,
    left_out_groups: u64,
}

/// An integer arg: a JSON integer, an integral finite float, or a decimal string.
fn int_arg(v: Option<&serde_json::Value>) -> Option<i64> {
    let v = v?;
    v.as_i64()
        .or_else(|| {
            v.as_f64().filter(|f| f.is_finite() && f.fract() == 0.0 && f.abs() < 9e15).map(|f| f as i64)
        })
        .or_else(|| v.as_str().filter(|s| s.len() <= 20).and_then(|s| s.trim().parse().ok()))
}

/// A string's first `max` bytes, cut at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Collector {
    fn kind(&mut self, k: &str) -> u16 {
        if let Some(&i) = self.kind_ids.get(k) {
            return i;
        }
        // The last place is kept for `other`: at most MAX_KINDS in all.
        let k = if self.kinds.len() >= MAX_KINDS - 1 { "other" } else { k };
        if let Some(&i) = self.kind_ids.get(k) {
            return i;
        }
        let i = self.kinds.len() as u16;
        self.kinds.push(k.to_owned());
        self.kind_ids.insert(k.to_owned(), i);
        i
    }

    /// The group's id; `None` past [`MAX_GROUPS`].
    fn group(&mut self, v: Option<&serde_json::Value>) -> Option<u16> {
        let name = match v {
            Some(serde_json::Value::String(s)) => cut(s, MAX_GROUP_BYTES).to_owned(),
            Some(serde_json::Value::Number(n)) => cut(&n.to_string(), MAX_GROUP_BYTES).to_owned(),
            _ => return Some(NONE16),
        };
        if let Some(&i) = self.group_ids.get(&name) {
            return Some(i);
        }
        if self.groups.len() >= MAX_GROUPS {
            self.left_out_groups += 1;
            return None;
        }
        let i = self.groups.len() as u16;
        self.groups.push(name.clone());
        self.group_ids.insert(name, i);
        Some(i)
    }

    /// One timeline event: kept when it is a collective of a detailed window.
    pub fn event(&mut self, e: &crate::reading::Event<'_>) {
        if e.ph != 'X' {
            return;
        }
        let (family, kind, completes) = if e.phase == CPU_FUNCTIONS {
            if e.name == words::PARAM_COMMS {
                let k = e.args.get(words::NAME_KEY).and_then(|v| v.as_str()).and_then(kind_of);
                (PARAM, Some(k.unwrap_or_else(|| "collective".to_owned())), false)
            } else if let Some(t) = e.name.strip_prefix(words::CALL_PREFIX) {
                (CALL, kind_of(t), false)
            } else if let Some(t) = e.name.strip_prefix(words::GLOO_PREFIX) {
                (BACKEND, kind_of(t), true)
            } else if let Some(t) = e.name.strip_prefix(words::NCCL_PREFIX) {
                (BACKEND, kind_of(t), false)
            } else {
                return;
            }
        } else if e.phase.starts_with(GPU_FUNCTIONS) {
            (KERNEL, kernel_kind(e.name), true)
        } else {
            return;
        };
        let Some(kind) = kind else { return };
        if self.records >= MAX_RECORDS {
            self.left_out_records += 1;
            return;
        }
        let rank = match self.rank_ids.get(e.node) {
            Some(&i) => i,
            None if self.ranks.len() >= MAX_RANKS => {
                self.left_out_ranks += 1;
                return;
            }
            None => {
                self.ranks.push((e.node.to_owned(), Rank::default()));
                self.rank_ids.insert(e.node.to_owned(), self.ranks.len() - 1);
                self.ranks.len() - 1
            }
        };
        let Some(group) = self.group(e.args.get(words::GROUP_KEY)) else { return };
        let kind = self.kind(&kind);
        let seq = int_arg(e.args.get(words::SEQ_KEY)).filter(|s| *s >= 0).unwrap_or(i64::MIN);
        let group_size = int_arg(e.args.get(words::GROUP_SIZE_KEY))
            .filter(|g| (1..=1 << 24).contains(g))
            .unwrap_or(-1) as i32;
        // The message: torch's `record_param_comms` args, else what `trainprof.torch` wrote from
        // torch's recorded shapes (docs/formats.md, "Collectives").
        let nelems = int_arg(e.args.get(words::IN_NELEMS_KEY)).filter(|n| (0..=1 << 50).contains(n));
        let dtype = e
            .args
            .get(words::DTYPE_KEY)
            .and_then(|v| v.as_str())
            .and_then(dtype_named)
            .or_else(|| int_arg(e.args.get(words::SCALAR_TYPE_KEY)).and_then(dtype_numbered));
        let size = dtype.map(|d| u64::from(words::SCALAR_TYPES[usize::from(d)].3));
        let bytes = nelems
            .zip(size)
            .and_then(|(n, s)| (n as u64).checked_mul(s))
            .map(|b| b as i64)
            .or_else(|| int_arg(e.args.get(words::MSG_BYTES_KEY)).filter(|b| (0..=1 << 60).contains(b)))
            .unwrap_or(-1);
        self.records += 1;
        self.ranks[rank].1.recs.push(Rec {
            start: e.start_us,
            end: e.start_us.saturating_add(e.dur_us.max(0)),
            step: e.step.unwrap_or(-1),
            seq,
            bytes,
            dtype: dtype.unwrap_or(NONE8),
            group_size,
            group,
            kind,
            family,
            completes,
        });
    }

    /// The caps reached, for `job.capped`.
    pub fn capped(&self) -> Vec<Capped> {
        [
            ("collectives", MAX_RECORDS, self.left_out_records),
            ("collective_ranks", MAX_RANKS, self.left_out_ranks),
            ("collective_groups", MAX_GROUPS, self.left_out_groups),
        ]
        .into_iter()
        .filter(|(_, _, n)| *n > 0)
        .map(|(what, limit, n)| Capped { what: what.into(), node: None, limit: limit as u64, left_out: n })
        .collect()
    }

    /// The collectives matched, the clocks aligned; `None` when no collective was read.
    /// `clock`: `job.clock`, the nodes' recorded error bounds.
    pub fn finish(self, clock: &[Clock]) -> Option<Collectives> {
        if self.records == 0 {
            return None;
        }
        let mut ranks = self.ranks;
        ranks.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, r) in &mut ranks {
            r.recs.sort_by_key(|x| (x.start, x.end));
        }
        let has = |r: &Rank, f: u8| r.recs.iter().any(|x| x.family == f);
        let cpu_ranks: Vec<&Rank> =
            ranks.iter().map(|(_, r)| r).filter(|r| r.recs.iter().any(|x| x.family != KERNEL)).collect();
        let by_seq = !cpu_ranks.is_empty()
            && cpu_ranks.iter().all(|r| r.recs.iter().any(|x| x.family == PARAM && x.seq != i64::MIN));
        // The anchor: the first family every rank has, else the one most ranks have.
        let anchor = if by_seq {
            PARAM
        } else {
            let count = |f: u8| ranks.iter().filter(|(_, r)| has(r, f)).count();
            [CALL, BACKEND, PARAM, KERNEL].into_iter().find(|&f| count(f) == ranks.len()).unwrap_or_else(
                || [CALL, BACKEND, PARAM, KERNEL].into_iter().max_by_key(|&f| count(f)).unwrap_or(CALL),
            )
        };
        let kernels = ranks.iter().flat_map(|(_, r)| &r.recs).filter(|x| x.family == KERNEL).count() as u64;

        // Each rank's collectives: key → (arrival, end, the anchor record).
        let mut matched: BTreeMap<(u16, i64, i64), Vec<Arrival>> = BTreeMap::new();
        let mut per_rank: Vec<CollectiveRank> = Vec::with_capacity(ranks.len());
        for (ri, (name, r)) in ranks.iter().enumerate() {
            let anchors = anchors(r, anchor, by_seq);
            let ends = completions(r, anchor, &anchors);
            let params = if anchor == PARAM { None } else { Some(paired(r, PARAM, &anchors)) };
            // gloo's range carries the message when torch recorded its input (the `c10d::` op's
            // is a list whose type torch does not write): docs/report.md, "Collectives across ranks".
            let backends = if anchor == BACKEND { None } else { Some(paired(r, BACKEND, &anchors)) };
            let places = ordinals(&anchors);
            for (i, a) in anchors.iter().enumerate() {
                let mut meta = params.as_ref().and_then(|p| p[i]).unwrap_or(*a);
                if let Some(b) =
                    backends.as_ref().and_then(|b| b[i]).filter(|b| meta.bytes < 0 && b.bytes >= 0)
                {
                    meta.bytes = b.bytes;
                    meta.dtype = b.dtype;
                }
                let key = if by_seq { (a.group, i64::MIN, a.seq) } else { (a.group, a.step, places[i]) };
                matched.entry(key).or_default().push(Arrival {
                    rank: ri,
                    at: a.start,
                    end: ends[i],
                    rec: *a,
                    meta,
                });
            }
            per_rank.push(CollectiveRank {
                rank: name.clone(),
                node: node_of(name).to_owned(),
                collectives: anchors.len() as u64,
                matched: 0,
                last: 0,
                last_share: None,
                others_waited_ms: 0.0,
                waited_ms: 0.0,
            });
        }
        matched.retain(|_, v| v.len() >= 2);
        let unmatched = per_rank.iter().map(|r| r.collectives).sum::<u64>()
            - matched.values().map(|v| v.len() as u64).sum::<u64>();

        let clocks = align(&per_rank, &matched, clock);
        let offset_us: Vec<i64> = per_rank
            .iter()
            .map(|r| {
                clocks
                    .iter()
                    .find(|c| c.node == r.node)
                    .and_then(|c| c.offset_ms)
                    .map_or(0, |ms| (ms * 1000.0).round() as i64)
            })
            .collect();

        let mut spreads = Vec::with_capacity(matched.len());
        let mut end_spreads = Vec::new();
        let mut all: Vec<Collective> = Vec::with_capacity(matched.len());
        let mut ranks_per = Vec::with_capacity(matched.len());
        for ((group, step, seq), v) in &matched {
            let at: Vec<i64> = v.iter().map(|a| a.at - offset_us[a.rank]).collect();
            let (mut first, mut last) = (0, 0);
            for (i, &t) in at.iter().enumerate() {
                if t < at[first] {
                    first = i;
                }
                if t > at[last] || (t == at[last] && v[i].rank > v[last].rank) {
                    last = i;
                }
            }
            let lr = v[last].rank;
            per_rank[lr].last += 1;
            for (i, a) in v.iter().enumerate() {
                let wait = (at[last] - at[i]) as f64 / 1000.0;
                per_rank[a.rank].matched += 1;
                per_rank[a.rank].waited_ms += wait;
                per_rank[lr].others_waited_ms += wait;
            }
            let spread = (at[last] - at[first]) as f64 / 1000.0;
            let ends: Vec<i64> = v.iter().filter_map(|a| a.end.map(|e| e - offset_us[a.rank])).collect();
            let end_spread = (ends.len() >= 2).then(|| {
                (ends.iter().max().copied().unwrap_or(0) - ends.iter().min().copied().unwrap_or(0)) as f64
                    / 1000.0
            });
            spreads.push(spread);
            end_spreads.extend(end_spread);
            ranks_per.push(v.len() as f64);
            let m = v[first].meta;
            all.push(Collective {
                group: self.groups.get(usize::from(*group)).cloned().unwrap_or_default(),
                seq: *seq,
                step: if by_seq { v[first].rec.step } else { *step },
                kind: self.kinds.get(usize::from(m.kind)).cloned().unwrap_or_default(),
                bytes: u64::try_from(m.bytes).ok(),
                dtype: words::SCALAR_TYPES.get(usize::from(m.dtype)).map(|t| t.0.to_owned()),
                group_size: u64::try_from(m.group_size).ok(),
                ranks: v.len() as u64,
                start_s: at[first] as f64 / 1e6,
                arrival_spread_ms: spread,
                end_spread_ms: end_spread,
                first_rank: ranks[v[first].rank].0.clone(),
                last_rank: ranks[lr].0.clone(),
            });
        }
        for r in &mut per_rank {
            r.last_share = (r.matched > 0).then(|| r.last as f64 / r.matched as f64);
        }
        ranks_per.sort_by(f64::total_cmp);
        let typical = quantile_sorted(&ranks_per, 0.5).unwrap_or(2.0).max(2.0);
        let late_rank = per_rank
            .iter()
            .filter(|r| r.matched >= MIN_LATE_COLLECTIVES)
            .filter_map(|r| r.last_share.map(|s| (r, s)))
            .filter(|(r, s)| *s >= LATE_SHARE.max(1.5 / typical) && r.others_waited_ms >= MIN_LATE_WAIT_MS * r.last as f64)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(r, s)| LateRank {
                rank: r.rank.clone(),
                last: r.last,
                matched: r.matched,
                last_share: s,
                others_waited_ms: r.others_waited_ms,
                summary: format!(
                    "{} arrived last at {} of its {} matched collectives ({:.0} %): the other ranks waited {:.1} ms for it in all.",
                    r.rank,
                    r.last,
                    r.matched,
                    s * 100.0,
                    r.others_waited_ms
                ),
            });
        let mut points: Vec<[f64; 2]> = all.iter().map(|c| [c.start_s, c.arrival_spread_ms]).collect();
        points.sort_by(|a, b| a[0].total_cmp(&b[0]));
        let chart = decimate(&points, CHART_POINTS);
        all.sort_by(|a, b| {
            b.arrival_spread_ms.total_cmp(&a.arrival_spread_ms).then(a.start_s.total_cmp(&b.start_s))
        });
        all.truncate(WIDEST);
        Some(Collectives {
            matched_by: if by_seq { MatchedBy::Seq } else { MatchedBy::Order },
            ranks: ranks.len() as u64,
            records: self.records as u64,
            matched: matched.len() as u64,
            unmatched,
            kernels,
            arrival_spread_ms: spread_of(spreads),
            end_spread_ms: spread_of(end_spreads),
            per_rank,
            widest: all,
            late_rank,
            clocks,
            chart,
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Arrival {
    rank: usize,
    /// The anchor's begin (raw, µs).
    at: i64,
    /// The collective's end on this rank (raw, µs), when a record of its completion was paired.
    end: Option<i64>,
    rec: Rec,
    /// The record its kind and sizes come from (the paired `record_param_comms`, else the anchor).
    meta: Rec,
}

/// A rank's node: the host of `<rank>-<host>`, else the rank's name.
pub fn node_of(rank: &str) -> &str {
    crate::analysis::fleet::rank_host(rank).unwrap_or(rank)
}

/// The rank's anchors: its records of the anchor family in start order; by sequence number,
/// the first record of each (group, seq).
fn anchors(r: &Rank, family: u8, by_seq: bool) -> Vec<Rec> {
    let mut out: Vec<Rec> = r.recs.iter().filter(|x| x.family == family).copied().collect();
    if by_seq {
        let mut seen = std::collections::HashSet::new();
        out.retain(|x| x.seq != i64::MIN && seen.insert((x.group, x.seq)));
    }
    out
}

/// Each anchor's place among its group's anchors of its step (anchors are in start order).
fn ordinals(anchors: &[Rec]) -> Vec<i64> {
    let mut seen: HashMap<(u16, i64), i64> = HashMap::new();
    anchors
        .iter()
        .map(|a| {
            let n = seen.entry((a.group, a.step)).or_default();
            *n += 1;
            *n - 1
        })
        .collect()
}

/// For each anchor, the record of `family` in the same place of its step, when the rank has
/// as many of them as anchors in that step (so the pairing by order is one to one).
fn paired(r: &Rank, family: u8, anchors: &[Rec]) -> Vec<Option<Rec>> {
    let mut per_step: HashMap<i64, Vec<Rec>> = HashMap::new();
    for x in r.recs.iter().filter(|x| x.family == family) {
        per_step.entry(x.step).or_default().push(*x);
    }
    let mut anchors_per_step: HashMap<i64, usize> = HashMap::new();
    for a in anchors {
        *anchors_per_step.entry(a.step).or_default() += 1;
    }
    let mut seen: HashMap<i64, usize> = HashMap::new();
    anchors
        .iter()
        .map(|a| {
            let k = seen.entry(a.step).or_default();
            let i = *k;
            *k += 1;
            per_step.get(&a.step).filter(|v| v.len() == anchors_per_step[&a.step]).map(|v| v[i])
        })
        .collect()
}

/// Each anchor's end, where a record of its completion is paired: the NCCL kernel, else
/// gloo's range on its worker thread (the anchor's own end when the anchor is that range).
fn completions(r: &Rank, anchor: u8, anchors: &[Rec]) -> Vec<Option<i64>> {
    if anchor == KERNEL || (anchor == BACKEND && anchors.iter().all(|a| a.completes)) {
        return anchors.iter().map(|a| Some(a.end)).collect();
    }
    if r.recs.iter().any(|x| x.family == KERNEL) {
        return paired(r, KERNEL, anchors).into_iter().map(|k| k.map(|k| k.end)).collect();
    }
    if anchor != BACKEND && r.recs.iter().any(|x| x.family == BACKEND && x.completes) {
        return paired(r, BACKEND, anchors)
            .into_iter()
            .map(|k| k.filter(|k| k.completes).map(|k| k.end))
            .collect();
    }
    vec![None; anchors.len()]
}

fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    quantile_sorted(v, 0.5)
}

/// Each node's clock offset from the ends its ranks share with the reference node's
/// (`docs/report.md`, "Clock alignment").
fn align(
    per_rank: &[CollectiveRank],
    matched: &BTreeMap<(u16, i64, i64), Vec<Arrival>>,
    clock: &[Clock],
) -> Vec<NodeClock> {
    let mut nodes: BTreeMap<&str, u64> = per_rank.iter().map(|r| (r.node.as_str(), 0)).collect();
    // Per collective, the median end of each node's ranks (µs, raw).
    let mut ends: Vec<BTreeMap<&str, f64>> = Vec::new();
    for v in matched.values() {
        let mut by: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for a in v {
            if let Some(e) = a.end {
                by.entry(per_rank[a.rank].node.as_str()).or_default().push(e as f64);
            }
        }
        if by.len() >= 2 || (by.len() == 1 && nodes.len() == 1) {
            let m: BTreeMap<&str, f64> =
                by.into_iter().filter_map(|(n, mut e)| median(&mut e).map(|m| (n, m))).collect();
            for n in m.keys() {
                if let Some(c) = nodes.get_mut(n) {
                    *c += 1;
                }
            }
            ends.push(m);
        }
    }
    let mut reference = None;
    for (n, c) in &nodes {
        if reference.is_none_or(|(_, best)| *c > best) {
            reference = Some((*n, *c));
        }
    }
    let Some((reference, _)) = reference else { return Vec::new() };
    let bound = |n: &str| {
        clock
            .iter()
            .find(|c| c.node == n && c.state == Some(ClockState::Synchronised))
            .and_then(|c| c.max_error_us)
    };
    let mut out = Vec::new();
    for n in nodes.keys() {
        let unaligned = |reason: String, shared: u64| NodeClock {
            node: (*n).to_owned(),
            state: AlignState::Unaligned,
            offset_ms: None,
            uncertainty_ms: None,
            mad_ms: None,
            collectives: shared,
            reason: Some(reason),
            bound_ms: None,
            within_bound: None,
        };
        if *n == reference {
            out.push(NodeClock {
                node: (*n).to_owned(),
                state: AlignState::Reference,
                offset_ms: Some(0.0),
                uncertainty_ms: Some(0.0),
                mad_ms: None,
                collectives: nodes[n],
                reason: None,
                bound_ms: None,
                within_bound: None,
            });
            continue;
        }
        let mut d: Vec<f64> = ends.iter().filter_map(|m| Some(m.get(n)? - m.get(reference)?)).collect();
        let shared = d.len();
        if shared == 0 {
            out.push(unaligned(format!("no collective end shared with the reference node {reference}"), 0));
            continue;
        }
        if shared < MIN_SHARED {
            out.push(unaligned(
                format!("{shared} collective ends shared with {reference}; {MIN_SHARED} are needed"),
                shared as u64,
            ));
            continue;
        }
        let Some(off) = median(&mut d) else { continue };
        let mut dev: Vec<f64> = d.iter().map(|x| (x - off).abs()).collect();
        let mad = median(&mut dev).unwrap_or(0.0);
        let scatter_ms = 1.4826 * mad / 1000.0;
        if scatter_ms > MAX_SCATTER_MS {
            out.push(unaligned(
                format!(
                    "the {shared} shared ends scatter by {scatter_ms:.1} ms (1.4826 × MAD), more than {MAX_SCATTER_MS} ms"
                ),
                shared as u64,
            ));
            continue;
        }
        let offset_ms = off / 1000.0;
        let uncertainty_ms = 1.2533 * scatter_ms / (shared as f64).sqrt();
        let bound_ms = bound(n).zip(bound(reference)).map(|(a, b)| (a + b) / 1000.0);
        out.push(NodeClock {
            node: (*n).to_owned(),
            state: AlignState::Aligned,
            offset_ms: Some(offset_ms),
            uncertainty_ms: Some(uncertainty_ms),
            mad_ms: Some(mad / 1000.0),
            collectives: shared as u64,
            reason: None,
            bound_ms,
            within_bound: bound_ms.map(|b| offset_ms.abs() - uncertainty_ms <= b),
        });
    }
    out
}

fn spread_of(mut v: Vec<f64>) -> Spread {
    v.sort_by(f64::total_cmp);
    Spread {
        count: v.len() as u64,
        p50_ms: quantile_sorted(&v, 0.5),
        p90_ms: quantile_sorted(&v, 0.9),
        max_ms: v.last().copied(),
    }
}

/// At most `cap` points: per slice of the (time-sorted) points, the one with the largest spread.
fn decimate(points: &[[f64; 2]], cap: usize) -> Vec<[f64; 2]> {
    if points.len() <= cap || cap == 0 {
        return points.to_vec();
    }
    let per = points.len().div_ceil(cap);
    points.chunks(per).filter_map(|c| c.iter().copied().max_by(|a, b| a[1].total_cmp(&b[1]))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hostile collectives stay within the caps: thousands of distinct kinds (past 64 they are
    /// `other`), process groups (past 256 left out and counted), names of 100 kB (cut to 64
    /// bytes), sequence numbers and sizes beyond any integer (read as not recorded).
    #[test]
    fn hostile_collectives_stay_within_the_caps() {
        let mut c = Collector::default();
        let huge = "g".repeat(100_000);
        for i in 0..2_000_i64 {
            let name = format!("c10d::allreduce{i}{}", "x".repeat(10_000));
            let group = if i % 3 == 0 { huge.clone() } else { format!("{i}{huge}") };
            let args: serde_json::Map<String, serde_json::Value> = serde_json::Map::from_iter([
                (words::GROUP_KEY.to_owned(), serde_json::Value::from(group)),
                (words::SEQ_KEY.to_owned(), serde_json::Value::from(1e300)),
                (words::IN_NELEMS_KEY.to_owned(), serde_json::Value::from(u64::MAX)),
                (words::GROUP_SIZE_KEY.to_owned(), serde_json::Value::from(i64::MAX)),
                (words::DTYPE_KEY.to_owned(), serde_json::Value::from("Double")),
                (words::MSG_BYTES_KEY.to_owned(), serde_json::Value::from(u64::MAX)),
                (words::SCALAR_TYPE_KEY.to_owned(), serde_json::Value::from(-6)),
            ]);
            for rank in ["0-a", "1-b"] {
                c.event(&crate::reading::Event {
                    node: rank,
                    phase: CPU_FUNCTIONS,
                    name: &name,
                    ph: 'X',
                    start_us: i * 1000,
                    dur_us: 10,
                    step: Some(i),
                    args: &args,
                });
            }
        }
        assert_eq!(c.kinds.len(), MAX_KINDS);
        assert!(c.kinds.iter().any(|k| k == "other") && c.kinds.iter().all(|k| k.len() <= KIND_BYTES));
        assert_eq!(c.groups.len(), MAX_GROUPS);
        assert!(c.groups.iter().all(|g| g.len() <= MAX_GROUP_BYTES));
        assert!(c.left_out_groups > 0);
        let kept = c.records;
        assert!(kept < 4000 && kept as u64 + c.left_out_groups == 4000, "{kept}");
        assert!(
            c.ranks
                .iter()
                .flat_map(|r| &r.1.recs)
                .all(|r| r.seq == i64::MIN && r.bytes == -1 && r.group_size == -1)
        );
        let capped = c.capped();
        assert!(capped.iter().any(|k| k.what == "collective_groups" && k.limit == MAX_GROUPS as u64));
        let out = c.finish(&[]).unwrap();
        assert!(out.widest.len() <= WIDEST && out.widest.iter().all(|w| w.group.len() <= MAX_GROUP_BYTES));
        assert!(std::mem::size_of::<Rec>() <= 56);
    }
}
