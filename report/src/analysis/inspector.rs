//! NCCL Inspector's records summed per process and communicator, and matched across processes
//! by (communicator id, `coll_sn`) (`docs/report.md`, "NCCL Inspector"). Inspector records each
//! collective's execution time, not when each rank reached it: the spread of execution times is
//! what can be compared, and a rank that arrives early waits inside the collective, so the
//! longest execution time marks a waiting rank as often as a slow one.

use std::collections::{BTreeMap, HashMap};

use trainprof_output::fs::Dir;

use crate::analysis::stats::quantile_sorted;
use crate::model::Capped;
use crate::model::collectives::{Inspector, InspectorComm, InspectorRank, InspectorSlowest, Spread};
use crate::reading::inspector::{self, MAX_RECORDS, Record};
use crate::reading::{Skipped, readable};

/// Communicators kept per job; records of further ones are counted per process but not matched.
pub const MAX_COMMS: usize = 4096;
/// Distinct kinds kept per process; further ones are counted as `other`.
pub const MAX_KINDS: usize = 32;

#[derive(Default)]
struct Proc {
    collectives: u64,
    kinds: BTreeMap<String, u64>,
    bytes: u64,
    exec_us: f64,
    busbw_sum: f64,
    busbw_n: u64,
    /// (n_ranks, rank) of its largest communicator.
    rank: Option<(i64, i64)>,
}

/// Reads the job's Inspector files and sums them; `None` without any. What the caps left out
/// is added to `capped`.
pub fn read(dir: &Dir, skipped: &mut Skipped, capped: &mut Vec<Capped>) -> Option<Inspector> {
    let mut procs: Vec<Proc> = Vec::new();
    let mut comms: Vec<(String, i64, u64)> = Vec::new();
    let mut comm_ix: HashMap<String, u32> = HashMap::new();
    let mut comm_procs: Vec<std::collections::BTreeSet<u32>> = Vec::new();
    // (communicator, sn, process, exec µs): 24 bytes each, MAX_RECORDS at most.
    let mut entries: Vec<(u32, u64, u32, f64)> = Vec::new();
    let (ps, counts) = inspector::read(dir, skipped, |p, r: Record| {
        if procs.len() <= p {
            procs.resize_with(p + 1, Proc::default);
        }
        let s = &mut procs[p];
        s.collectives += 1;
        let kind = if s.kinds.len() < MAX_KINDS || s.kinds.contains_key(&r.kind) {
            r.kind.clone()
        } else {
            "other".into()
        };
        *s.kinds.entry(kind).or_default() += 1;
        s.bytes = s.bytes.saturating_add(r.bytes.unwrap_or(0));
        s.exec_us += r.exec_us;
        if let Some(b) = r.busbw_gbs {
            s.busbw_sum += b;
            s.busbw_n += 1;
        }
        if s.rank.is_none_or(|(n, _)| r.n_ranks > n) {
            s.rank = Some((r.n_ranks, r.rank));
        }
        let c = match comm_ix.get(&r.comm) {
            Some(&c) => c,
            None if comms.len() < MAX_COMMS => {
                comms.push((r.comm.clone(), r.n_ranks, 0));
                comm_procs.push(Default::default());
                comm_ix.insert(r.comm.clone(), (comms.len() - 1) as u32);
                (comms.len() - 1) as u32
            }
            None => return,
        };
        comms[c as usize].2 += 1;
        comm_procs[c as usize].insert(p as u32);
        entries.push((c, r.sn, p as u32, r.exec_us));
    });
    if counts.left_out_records > 0 {
        capped.push(Capped {
            what: "nccl_inspector_records".into(),
            node: None,
            limit: MAX_RECORDS,
            left_out: counts.left_out_records,
        });
    }
    if counts.left_out_files > 0 {
        capped.push(Capped {
            what: "nccl_inspector_files".into(),
            node: None,
            limit: inspector::MAX_FILES as u64,
            left_out: counts.left_out_files,
        });
    }
    if ps.is_empty() {
        return None;
    }
    procs.resize_with(ps.len(), Proc::default);
    // Matched: one group per (communicator, sn) with two processes or more.
    entries.sort_by_key(|e| (e.0, e.1, e.2));
    let n = ps.len();
    let (mut matched_n, mut matched_us, mut longest, mut shortest) =
        (vec![0u64; n], vec![0f64; n], vec![0u64; n], vec![0u64; n]);
    let mut spreads = Vec::new();
    for g in entries.chunk_by(|a, b| a.0 == b.0 && a.1 == b.1) {
        let mut g: Vec<_> = g.to_vec();
        g.dedup_by_key(|e| e.2);
        if g.len() < 2 {
            continue;
        }
        let max = g.iter().max_by(|a, b| a.3.total_cmp(&b.3)).map_or(0, |e| e.2 as usize);
        let min = g.iter().min_by(|a, b| a.3.total_cmp(&b.3)).map_or(0, |e| e.2 as usize);
        let (lo, hi) =
            g.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), e| (l.min(e.3), h.max(e.3)));
        spreads.push((hi - lo) / 1000.0);
        longest[max] += 1;
        shortest[min] += 1;
        for e in &g {
            matched_n[e.2 as usize] += 1;
            matched_us[e.2 as usize] += e.3;
        }
    }
    spreads.sort_by(f64::total_cmp);
    let per_rank: Vec<InspectorRank> = ps
        .iter()
        .zip(procs)
        .enumerate()
        .map(|(i, (p, s))| InspectorRank {
            host: p.host.clone(),
            pid: p.pid,
            rank: s.rank.map(|r| r.1),
            collectives: s.collectives,
            kinds: s.kinds,
            bytes: s.bytes,
            gpu_time_ms: s.exec_us / 1000.0,
            mean_busbw_gbs: (s.busbw_n > 0).then(|| s.busbw_sum / s.busbw_n as f64),
            matched: matched_n[i],
            matched_gpu_time_ms: matched_us[i] / 1000.0,
            longest: longest[i],
            shortest: shortest[i],
        })
        .collect();
    let sharing: Vec<&InspectorRank> = per_rank.iter().filter(|r| r.matched > 0).collect();
    let slowest = (sharing.len() >= 2)
        .then(|| {
            let mut times: Vec<f64> = sharing.iter().map(|r| r.matched_gpu_time_ms).collect();
            times.sort_by(f64::total_cmp);
            let median = quantile_sorted(&times, 0.5).unwrap_or(0.0);
            sharing.iter().max_by(|a, b| a.matched_gpu_time_ms.total_cmp(&b.matched_gpu_time_ms)).map(|r| {
                let who = match r.rank {
                    Some(k) => format!("rank {k} ({} pid {})", r.host, r.pid.map_or("?".into(), |p| p.to_string())),
                    None => format!("{} pid {}", r.host, r.pid.map_or("?".into(), |p| p.to_string())),
                };
                InspectorSlowest {
                    host: r.host.clone(),
                    pid: r.pid,
                    rank: r.rank,
                    matched_gpu_time_ms: r.matched_gpu_time_ms,
                    median_ms: median,
                    longest: r.longest,
                    matched: r.matched,
                    summary: format!(
                        "{who}: {} ms of collective execution time over its {} matched collectives, against a median \
                         of {} ms; the longest at {} of them",
                        readable(r.matched_gpu_time_ms, Some(1)),
                        r.matched,
                        readable(median, Some(1)),
                        r.longest
                    ),
                }
            })
        })
        .flatten();
    let communicators = comms
        .into_iter()
        .zip(comm_procs)
        .map(|((id, n_ranks, records), p)| InspectorComm { id, n_ranks, processes: p.len() as u64, records })
        .collect();
    Some(Inspector {
        files: counts.files,
        records: counts.records,
        bad_records: counts.bad,
        communicators,
        matched: spreads.len() as u64,
        exec_spread_ms: Spread {
            count: spreads.len() as u64,
            p50_ms: quantile_sorted(&spreads, 0.5),
            p90_ms: quantile_sorted(&spreads, 0.9),
            max_ms: spreads.last().copied(),
        },
        per_rank,
        slowest,
    })
}
