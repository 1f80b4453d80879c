//! Collectives matched across ranks and the nodes' clocks aligned from them
//! (`docs/report.md`, "Collectives across ranks"), on timelines written here as the torch
//! adapter writes them: a late rank planted, a node's clock shifted, a node that shares no
//! collective, both NCCL kernel names, hostile args.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use serde_json::{Value, json};
use trainprof_report::model::{AlignState, MatchedBy, ReportModel};
use trainprof_report::{Options, build, page, to_json};

const BASE: i64 = 1_795_400_000_000_000;

/// One rank's timeline: `cpu_functions` (pid 1) and `gpu_functions-dev:0` (pid 2) events,
/// times in epoch µs.
struct Timeline {
    events: Vec<Value>,
}

impl Timeline {
    fn new() -> Timeline {
        Timeline {
            events: vec![
                json!({"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": BASE}}),
                json!({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "cpu_functions"}}),
                json!({"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "gpu_functions-dev:0"}}),
            ],
        }
    }

    fn op(&mut self, name: &str, start: i64, end: i64, step: i64, tid: i64, extra: Value) {
        let mut args = json!({"pid": 7, "step_num": step.to_string(), "tid": tid});
        if let (Some(a), Value::Object(x)) = (args.as_object_mut(), extra) {
            a.extend(x);
        }
        self.events.push(
            json!({"name": name, "pid": 1, "ph": "X", "ts": start - BASE, "dur": end - start, "args": args}),
        );
    }

    fn kernel(&mut self, name: &str, start: i64, end: i64, step: i64) {
        self.events.push(json!({"name": name, "pid": 2, "ph": "X", "ts": start - BASE, "dur": end - start,
            "args": {"pid": 7, "step_num": step.to_string(), "device": 0, "stream": 20}}));
    }

    fn write(self, root: &Path, rank: &str) {
        let hour = root.join("framework/pevents/2026112203");
        std::fs::create_dir_all(&hour).unwrap();
        std::fs::write(
            hour.join(format!("1795400100000000_{rank}_pythontimeline.json")),
            Value::from(self.events).to_string(),
        )
        .unwrap();
    }
}

/// A small deterministic jitter in 0..`span` µs.
fn jitter(a: i64, b: i64, span: i64) -> i64 {
    // splitmix64
    let mut z =
        (a as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (b as u64).wrapping_add(0x6A09_E667_F3BC_C909);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % span as u64) as i64
}

const STEPS: i64 = 30;
const PER_STEP: i64 = 2;
const LATE_US: i64 = 20_000;
const SHIFT_US: i64 = 37_000;

/// Four ranks on two nodes (`0-nodea`, `1-nodea`, `2-nodeb`, `3-nodeb`) on CPU with gloo:
/// `c10d::allreduce_` on the calling thread, `gloo:all_reduce` on a worker thread until the
/// collective ends (the same instant on every rank, give or take 100 µs). Rank 3 reaches every
/// collective `late` µs after the others; node B's clock reads `shift` µs ahead.
fn gloo_job(root: &Path, late: i64, shift: i64) {
    for (r, l) in gloo_timelines(late, shift).into_iter().enumerate() {
        l.write(root, &format!("{r}-node{}", if r < 2 { "a" } else { "b" }));
    }
}

/// [`gloo_job`]'s timelines, to be written.
fn gloo_timelines(late: i64, shift: i64) -> Vec<Timeline> {
    let mut tl: Vec<Timeline> = (0..4).map(|_| Timeline::new()).collect();
    for s in 0..STEPS {
        for c in 0..PER_STEP {
            let t = BASE + 1_000_000 + s * 200_000 + c * 60_000;
            let arrive: Vec<i64> =
                (0..4).map(|r| t + jitter(r, s * 10 + c, 2000) + if r == 3 { late } else { 0 }).collect();
            let done = arrive.iter().max().unwrap() + 5000;
            for (r, l) in tl.iter_mut().enumerate() {
                let r = r as i64;
                let off = if r >= 2 { shift } else { 0 };
                let a = arrive[r as usize] + off;
                let e = done + jitter(r, s * 10 + c + 5, 100) + off;
                l.op("c10d::allreduce_", a, a + 40, s, 1, json!({}));
                l.op("gloo:all_reduce", a + 15, e, s, 2, json!({}));
                // Not collectives: an op, a point-to-point call.
                l.op("aten::add", a - 500, a - 400, s, 1, json!({}));
                l.op("c10d::send", a - 300, a - 200, s, 1, json!({}));
            }
        }
    }
    tl
}

fn model(root: &Path) -> ReportModel {
    build(root, "src", &Options::default()).unwrap()
}

#[test]
fn a_late_rank_is_named_and_a_shifted_node_is_aligned() {
    let dir = tempfile::tempdir().unwrap();
    gloo_job(dir.path(), LATE_US, SHIFT_US);
    let m = model(dir.path());
    let c = m.collectives.as_ref().expect("collectives");
    assert_eq!(c.matched_by, MatchedBy::Order);
    assert_eq!((c.ranks, c.matched, c.unmatched), (4, (STEPS * PER_STEP) as u64, 0));
    let r3 = c.per_rank.iter().find(|r| r.rank == "3-nodeb").unwrap();
    assert!(r3.last_share.unwrap() >= 0.9, "{r3:?}");
    // Each collective: the three others waited about 20 ms (less their jitter) for rank 3.
    let per = r3.others_waited_ms / r3.last as f64;
    assert!((3.0 * 18.0..=3.0 * 20.5).contains(&per), "{per}");
    let late = c.late_rank.as_ref().expect("a late rank");
    assert_eq!(late.rank, "3-nodeb");
    assert!(late.summary.contains("3-nodeb arrived last at"), "{}", late.summary);
    let b = c.clocks.iter().find(|k| k.node == "nodeb").unwrap();
    let a = c.clocks.iter().find(|k| k.node == "nodea").unwrap();
    assert_eq!(a.state, AlignState::Reference);
    assert_eq!(b.state, AlignState::Aligned, "{b:?}");
    let off = b.offset_ms.unwrap();
    assert!((off - SHIFT_US as f64 / 1000.0).abs() <= 2.0, "{off}");
    assert!(b.uncertainty_ms.unwrap() < 1.0 && b.collectives == (STEPS * PER_STEP) as u64, "{b:?}");
    // Aligned, the collectives' ends agree within 1 ms.
    assert!(c.end_spread_ms.max_ms.unwrap() < 1.0, "{:?}", c.end_spread_ms);
    // The widest arrival spreads are rank 3's 20 ms, not the clocks' 37 ms.
    assert!(
        c.widest.iter().all(|w| w.last_rank == "3-nodeb" && w.arrival_spread_ms < 23.0),
        "{:?}",
        c.widest
    );
    // In --json and on the page.
    let j: Value = serde_json::from_str(&to_json(&m)).unwrap();
    assert_eq!(j["collectives"]["late_rank"]["rank"], "3-nodeb");
    assert_eq!(j["collectives"]["clocks"][1]["state"], "aligned");
    let html = page::render(&m);
    assert!(html.contains("<section id=\"collectives\">"));
    assert!(html.contains("3-nodeb arrived last at"));
}

/// The late rank in the straggler findings, beside the fleet scores: its steps are as long as
/// the others' (it is slow before the collective, the others wait inside it), so it is no
/// straggler by its score, and the collectives name it.
#[test]
fn the_late_rank_stands_beside_the_fleet_scores() {
    for late in [LATE_US, 0] {
        let dir = tempfile::tempdir().unwrap();
        let mut tl = gloo_timelines(late, SHIFT_US);
        for (r, l) in tl.iter_mut().enumerate() {
            let off = if r >= 2 { SHIFT_US } else { 0 };
            l.events.push(
                json!({"name": "process_name", "ph": "M", "pid": 3, "args": {"name": "Step:ModeKeys.TRAIN"}}),
            );
            for s in 0..STEPS {
                let t = BASE + 1_000_000 + s * 200_000 + off;
                l.events.push(json!({"name": "Step:ModeKeys.TRAIN", "pid": 3, "ph": "X", "ts": t - BASE,
                    "dur": 199_000 - jitter(r as i64, s, 500), "args": {"pid": 7, "step_num": s.to_string()}}));
            }
        }
        for (r, l) in tl.into_iter().enumerate() {
            l.write(dir.path(), &format!("{r}-node{}", if r < 2 { "a" } else { "b" }));
        }
        let m = model(dir.path());
        let f = m.fleet.as_ref().expect("fleet");
        assert_eq!(f.ranks, 4);
        if late == 0 {
            assert!(f.late_rank.is_none(), "{:?}", f.late_rank);
            assert!(!page::render(&m).contains("Last at collectives"));
            continue;
        }
        let l = f.late_rank.as_ref().expect("the late rank beside the scores");
        let c = m.collectives.as_ref().unwrap().late_rank.as_ref().unwrap();
        assert_eq!(
            (l.rank.as_str(), l.last_share, l.others_waited_ms),
            ("3-nodeb", c.last_share, c.others_waited_ms)
        );
        assert!(!l.straggler && f.stragglers.is_empty(), "{l:?}");
        let score = f.scores.iter().find(|s| s.rank == "3-nodeb").unwrap().score;
        assert_eq!(l.score, Some(score));
        assert!(l.summary.contains("no straggler"), "{}", l.summary);
        let j: Value = serde_json::from_str(&to_json(&m)).unwrap();
        assert_eq!(j["fleet"]["late_rank"]["rank"], "3-nodeb");
        assert_eq!(j["fleet"]["late_rank"]["straggler"], false);
        let html = page::render(&m);
        let fleet = &html[html.find("<section id=\"fleet\">").unwrap()..];
        let fleet = &fleet[..fleet.find("</section>").unwrap()];
        assert!(fleet.contains("<b>Last at collectives: 3-nodeb</b>"), "{fleet}");
    }
}

#[test]
fn without_a_late_rank_none_is_named() {
    let dir = tempfile::tempdir().unwrap();
    gloo_job(dir.path(), 0, SHIFT_US);
    let c = model(dir.path()).collectives.unwrap();
    assert!(c.late_rank.is_none(), "{:?}", c.late_rank);
    assert!(c.per_rank.iter().all(|r| r.last_share.unwrap() < 0.6), "{:?}", c.per_rank);
    assert!(c.arrival_spread_ms.max_ms.unwrap() < 2.5, "{:?}", c.arrival_spread_ms);
}

#[test]
fn a_node_without_a_shared_collective_is_unaligned() {
    let dir = tempfile::tempdir().unwrap();
    gloo_job(dir.path(), LATE_US, SHIFT_US);
    // Two ranks of node C, in steps no other rank has: matched with each other only.
    for r in [4, 5] {
        let mut l = Timeline::new();
        for s in 100..110 {
            let t = BASE + 20_000_000 + s * 100_000 + r * 300;
            l.op("c10d::allreduce_", t, t + 40, s, 1, json!({}));
            l.op("gloo:all_reduce", t + 10, BASE + 20_000_000 + s * 100_000 + 5000, s, 2, json!({}));
        }
        l.write(dir.path(), &format!("{r}-nodec"));
    }
    let c = model(dir.path()).collectives.unwrap();
    let k = c.clocks.iter().find(|k| k.node == "nodec").unwrap();
    assert_eq!(k.state, AlignState::Unaligned, "{k:?}");
    assert_eq!(k.offset_ms, None);
    assert!(k.reason.as_deref().unwrap().contains("no collective end shared"), "{k:?}");
    assert_eq!(c.clocks.iter().find(|k| k.node == "nodeb").unwrap().state, AlignState::Aligned);
}

#[test]
fn too_few_shared_collectives_leave_a_node_unaligned() {
    let dir = tempfile::tempdir().unwrap();
    let mut tl: Vec<Timeline> = (0..2).map(|_| Timeline::new()).collect();
    for s in 0..3 {
        for (r, l) in tl.iter_mut().enumerate() {
            let t = BASE + 1_000_000 + s * 100_000 + r as i64 * 100;
            l.op("c10d::allreduce_", t, t + 40, s, 1, json!({}));
            l.op("gloo:all_reduce", t + 10, BASE + 1_000_000 + s * 100_000 + 3000, s, 2, json!({}));
        }
    }
    for (r, l) in tl.into_iter().enumerate() {
        l.write(dir.path(), &format!("{r}-host{r}"));
    }
    let c = model(dir.path()).collectives.unwrap();
    let k = c.clocks.iter().find(|k| k.node == "host1").unwrap();
    assert_eq!((k.state, k.collectives), (AlignState::Unaligned, 3), "{k:?}");
    assert!(k.reason.as_deref().unwrap().contains("5 are needed"));
}

/// gloo on CPU with torch's `record_shapes`: `trainprof.torch` writes each `gloo:all_reduce`'s
/// message (`msg_bytes`, `scalar_type`: c10's number) from torch's `Input Dims` and `Input
/// type`; the `c10d::allreduce_` op has none (its input is a list torch gives no type). Each
/// collective's bytes and type are its gloo range's: per step a bucket of 1,089 floats, then
/// one of 300 doubles (docs/formats.md, "Collectives").
#[test]
fn gloo_collectives_take_their_message_from_the_recorded_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [(1089_i64 * 4, 6, "Float"), (300 * 8, 7, "Double")];
    for r in 0..2_i64 {
        let mut l = Timeline::new();
        for s in 0..STEPS {
            for (c, (bytes, code, _)) in sizes.iter().enumerate() {
                let t = BASE + 1_000_000 + s * 200_000 + c as i64 * 60_000 + r * 700;
                let done = BASE + 1_000_000 + s * 200_000 + c as i64 * 60_000 + 5000;
                l.op("c10d::allreduce_", t, t + 40, s, 1, json!({}));
                l.op("gloo:all_reduce", t + 15, done, s, 2, json!({"msg_bytes": bytes, "scalar_type": code}));
            }
        }
        l.write(dir.path(), &format!("{r}-nodea"));
    }
    let m = model(dir.path());
    let c = m.collectives.as_ref().unwrap();
    assert_eq!((c.matched_by, c.matched), (MatchedBy::Order, (STEPS * 2) as u64));
    assert!(!c.widest.is_empty());
    for w in &c.widest {
        let (bytes, _, name) = sizes[w.seq as usize];
        assert_eq!((w.bytes, w.dtype.as_deref()), (Some(bytes as u64), Some(name)), "{w:?}");
    }
    // In --json as well.
    let j = serde_json::to_value(c).unwrap();
    assert!(j["widest"].as_array().unwrap().iter().all(|w| w["bytes"].is_u64() && w["dtype"].is_string()));
}

/// Two ranks on one H200 node each, as torch records NCCL: `record_param_comms` with its args
/// (the sequence number among them) and the kernel, one rank's in each era's name.
#[test]
fn nccl_collectives_match_by_sequence_number_in_both_kernel_eras() {
    let dir = tempfile::tempdir().unwrap();
    let kernels = [
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWork*)",
    ];
    for (r, kernel) in kernels.iter().enumerate() {
        let mut l = Timeline::new();
        for seq in 0..12_i64 {
            let t = BASE + 1_000_000 + seq * 50_000 + if r == 1 { 3000 } else { 0 };
            let args = json!({"Collective name": "allreduce", "Process Group Name": "0", "Seq": seq + 1,
                "In msg nelems": 1_000_000, "Out msg nelems": 1_000_000, "Group size": 2, "dtype": "Float",
                "Process Group Ranks": "[0, 1]", "Rank": r});
            l.op("c10d::allreduce_", t, t + 60, seq, 1, json!({}));
            l.op("record_param_comms", t + 5, t + 50, seq, 1, args);
            l.op("nccl:all_reduce", t + 10, t + 45, seq, 1, json!({}));
            let done = BASE + 1_000_000 + seq * 50_000 + 8000;
            l.kernel(kernel, t + 100, done + r as i64 * 20, seq);
        }
        l.write(dir.path(), &format!("{r}-gpu{r}"));
    }
    let m = model(dir.path());
    let c = m.collectives.as_ref().unwrap();
    assert_eq!(c.matched_by, MatchedBy::Seq);
    assert_eq!((c.matched, c.kernels), (12, 24));
    let w = &c.widest[0];
    assert_eq!(
        (w.kind.as_str(), w.group.as_str(), w.bytes, w.dtype.as_deref(), w.group_size),
        ("allreduce", "0", Some(4_000_000), Some("Float"), Some(2))
    );
    assert!(c.per_rank.iter().find(|r| r.rank == "1-gpu1").unwrap().last == 12);
    let k = c.clocks.iter().find(|k| k.node == "gpu1").unwrap();
    assert_eq!(k.state, AlignState::Aligned);
    assert!(k.offset_ms.unwrap().abs() < 0.05, "{k:?}");
    // Both eras are communication kernels in the detailed windows.
    let total = m.detailed.total.as_ref().unwrap();
    let comm = total.classes.iter().find(|s| s.name == "communication").unwrap();
    assert_eq!(comm.count, Some(24));
}

#[test]
fn jobs_without_collectives_have_no_collectives_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = Timeline::new();
    l.op("aten::mm", BASE + 1000, BASE + 2000, 1, 1, json!({}));
    l.op("c10d::send", BASE + 3000, BASE + 4000, 1, 1, json!({}));
    l.write(dir.path(), "0-algo-1");
    let m = model(dir.path());
    assert!(m.collectives.is_none());
    assert!(!to_json(&m).contains("\"collectives\""));
}

#[test]
fn hostile_args_stay_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let big = "g".repeat(100_000);
    let bad = [
        json!(big),
        json!([1, 2]),
        json!({"a": 1}),
        json!(1e300),
        json!(-5),
        json!("12abc"),
        json!(null),
        json!(true),
    ];
    for r in 0..2 {
        let mut l = Timeline::new();
        for i in 0..400_i64 {
            let v = bad[i as usize % bad.len()].clone();
            let group = if i % 4 == 1 { v.clone() } else { json!(format!("group-{i}")) };
            let args = json!({"Collective name": v, "Process Group Name": group, "Seq": v,
                "In msg nelems": if i % 2 == 0 { json!(1e30) } else { v.clone() }, "Group size": v, "dtype": v});
            let t = BASE + 1_000_000 + i * 1000;
            l.op("record_param_comms", t, t + 10, i, 1, args);
            l.op(&format!("c10d::allreduce_{}", "x".repeat(200)), t, t + 10, i, 1, json!({}));
        }
        l.write(dir.path(), &format!("{r}-h{r}"));
    }
    let m = model(dir.path());
    let c = m.collectives.as_ref().unwrap();
    assert!(
        m.job.capped.iter().any(|k| k.what == "collective_groups" && k.limit == 256),
        "{:?}",
        m.job.capped
    );
    for w in &c.widest {
        assert!(w.group.len() <= 64 && w.kind.len() <= 32, "{w:?}");
        assert!(w.bytes.is_none() && w.group_size.is_none(), "{w:?}");
    }
    assert!(to_json(&m).len() < 200_000);
}

/// `trainprof trace` of `root` as `settings` say: its events and what it wrote.
fn trace(
    root: &Path,
    settings: &trainprof_report::trace::Settings,
) -> (Vec<Value>, trainprof_report::trace::Written) {
    use std::io::Read as _;
    let mut buf = Vec::new();
    let w = trainprof_report::trace::write_with(root, &mut buf, &Default::default(), settings).unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(&buf[..]).read_to_string(&mut text).unwrap();
    (serde_json::from_str(&text).unwrap(), w)
}

/// Per collective (step, place in the step), the spread of its `gloo:all_reduce` ends over
/// the ranks in the trace, µs.
fn end_spreads(events: &[Value]) -> Vec<i64> {
    use std::collections::BTreeMap;
    let names: BTreeMap<i64, String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| (e["pid"].as_i64().unwrap(), e["args"]["name"].as_str().unwrap().to_owned()))
        .collect();
    let mut per_rank: BTreeMap<&str, BTreeMap<i64, Vec<i64>>> = BTreeMap::new();
    for e in events.iter().filter(|e| e["name"] == "gloo:all_reduce") {
        let rank = names[&e["pid"].as_i64().unwrap()].as_str();
        let step: i64 = e["args"]["step_num"].as_str().unwrap().parse().unwrap();
        let end = e["ts"].as_i64().unwrap() + e["dur"].as_i64().unwrap();
        per_rank.entry(rank).or_default().entry(step).or_default().push(end);
    }
    assert_eq!(per_rank.len(), 4, "{:?}", per_rank.keys());
    let mut by: BTreeMap<(i64, usize), Vec<i64>> = BTreeMap::new();
    for steps in per_rank.values_mut() {
        for (step, ends) in steps.iter_mut() {
            ends.sort_unstable();
            for (i, e) in ends.iter().enumerate() {
                by.entry((*step, i)).or_default().push(*e);
            }
        }
    }
    by.values()
        .map(|v| {
            assert_eq!(v.len(), 4);
            v.iter().max().unwrap() - v.iter().min().unwrap()
        })
        .collect()
}

/// The trace moves node B's events by the offset the collectives give (its process names and
/// their args say by how much and how sure): each collective's end then agrees across the
/// four ranks within 1 ms; as recorded (`--unaligned`) the planted 37 ms stay.
#[test]
fn the_trace_is_aligned_and_says_by_how_much() {
    use trainprof_report::trace::Settings;
    let dir = tempfile::tempdir().unwrap();
    gloo_job(dir.path(), LATE_US, SHIFT_US);
    let (events, w) = trace(dir.path(), &Settings::default());
    assert!(w.aligned);
    let b = w.clocks.iter().find(|k| k.node == "nodeb").unwrap();
    assert_eq!(b.state, AlignState::Aligned);
    let spreads = end_spreads(&events);
    assert_eq!(spreads.len(), (STEPS * PER_STEP) as usize);
    assert!(spreads.iter().all(|s| *s < 1000), "{spreads:?}");
    let names: Vec<&Value> =
        events.iter().filter(|e| e["ph"] == "M" && e["name"] == "process_name").collect();
    let rank2 =
        names.iter().find(|e| e["args"]["name"].as_str().unwrap().starts_with("rank 2-nodeb")).unwrap();
    let label = rank2["args"]["name"].as_str().unwrap();
    assert!(label.starts_with("rank 2-nodeb (clock: moved -37.") && label.contains(" ms ± "), "{label}");
    let moved = rank2["args"]["clock"]["moved_us"].as_i64().unwrap();
    assert!((moved + SHIFT_US).abs() <= 2000, "{moved}");
    assert_eq!(rank2["args"]["clock"]["state"], "aligned");
    let rank0 =
        names.iter().find(|e| e["args"]["name"].as_str().unwrap().starts_with("rank 0-nodea")).unwrap();
    assert_eq!(rank0["args"]["name"], "rank 0-nodea (clock: the reference)");

    let (raw, w) = trace(dir.path(), &Settings { unaligned: true, node: None });
    assert!(!w.aligned);
    let spreads = end_spreads(&raw);
    assert!(spreads.iter().all(|s| *s >= SHIFT_US - 1000), "{spreads:?}");
}

/// A node the collectives cannot align is left where it is, and the trace says so.
#[test]
fn the_trace_leaves_an_unaligned_node_as_recorded() {
    use trainprof_report::trace::Settings;
    let dir = tempfile::tempdir().unwrap();
    let mut tl: Vec<Timeline> = (0..2).map(|_| Timeline::new()).collect();
    for s in 0..3 {
        for (r, l) in tl.iter_mut().enumerate() {
            let t = BASE + 1_000_000 + s * 100_000 + r as i64 * 100;
            l.op("c10d::allreduce_", t, t + 40, s, 1, json!({}));
            l.op(
                "gloo:all_reduce",
                t + 10,
                BASE + 1_000_000 + s * 100_000 + 3000 + r as i64 * 9000,
                s,
                2,
                json!({}),
            );
        }
    }
    for (r, l) in tl.into_iter().enumerate() {
        l.write(dir.path(), &format!("{r}-host{r}"));
    }
    let (events, w) = trace(dir.path(), &Settings::default());
    assert_eq!(w.clocks.iter().find(|k| k.node == "host1").unwrap().state, AlignState::Unaligned);
    let p = events
        .iter()
        .find(|e| e["ph"] == "M" && e["args"]["name"].as_str().is_some_and(|n| n.starts_with("rank 1-host1")))
        .unwrap();
    assert_eq!(p["args"]["name"], "rank 1-host1 (clock: unaligned, as recorded)");
    assert_eq!(p["args"]["clock"]["state"], "unaligned");
    // Its ends stay where they were recorded: 9 ms after host0's.
    let ends: Vec<i64> = events
        .iter()
        .filter(|e| e["name"] == "gloo:all_reduce" && e["pid"] == p["pid"])
        .map(|e| e["ts"].as_i64().unwrap() + e["dur"].as_i64().unwrap())
        .collect();
    assert_eq!(ends, (0..3).map(|s| BASE + 1_000_000 + s * 100_000 + 12_000).collect::<Vec<_>>());
}

/// The members of a tar: (name, bytes), in order.
fn untar(b: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 512 <= b.len() && b[at] != 0 {
        let h = &b[at..at + 512];
        let name = std::str::from_utf8(&h[..100]).unwrap().trim_end_matches('\0').to_owned();
        assert_eq!(&h[257..263], b"ustar\0");
        let size = u64::from_str_radix(std::str::from_utf8(&h[124..135]).unwrap(), 8).unwrap() as usize;
        let sum = u32::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap(), 8).unwrap();
        let want: u32 =
            h.iter().enumerate().map(|(i, x)| if (148..156).contains(&i) { 32 } else { u32::from(*x) }).sum();
        assert_eq!(sum, want, "{name}");
        out.push((name, b[at + 512..at + 512 + size].to_vec()));
        at += 512 + size.div_ceil(512) * 512;
    }
    assert!(b[at..].iter().all(|x| *x == 0) && b.len() - at >= 1024);
    out
}

/// `trace --per-node-archive`: the manifest first, each node's trace with its times as
/// recorded, and the manifest's offsets the collectives' estimates.
#[test]
fn the_per_node_archive_holds_raw_traces_and_the_estimated_offsets() {
    let dir = tempfile::tempdir().unwrap();
    gloo_job(dir.path(), LATE_US, SHIFT_US);
    let clocks = model(dir.path()).collectives.unwrap().clocks;
    let mut f = std::io::Cursor::new(Vec::new());
    let a = trainprof_report::trace::archive::write(dir.path(), &mut f, &Default::default()).unwrap();
    let members = untar(f.get_ref());
    let names: Vec<&str> = members.iter().map(|m| m.0.as_str()).collect();
    assert_eq!(names, ["perfetto_manifest.json", "000-nodea.json", "001-nodeb.json"]);
    let m: Value = serde_json::from_slice(&members[0].1).unwrap();
    let files = m["perfetto_manifest"]["files"].as_array().unwrap();
    assert_eq!(m["perfetto_manifest"]["version"], 1);
    for (f, node) in files.iter().zip(["nodea", "nodeb"]) {
        assert_eq!(f["machine"]["name"], node);
        let est = clocks.iter().find(|c| c.node == node).unwrap().offset_ms.unwrap();
        assert_eq!(f["clocks"]["offset_ns"].as_i64().unwrap(), (est * 1000.0).round() as i64 * 1000);
    }
    assert!((files[1]["clocks"]["offset_ns"].as_i64().unwrap() - SHIFT_US * 1000).abs() < 2_000_000);
    // Each node's file has its ranks only, times as recorded: node B's ends 37 ms after A's.
    let ends = |bytes: &[u8]| -> Vec<(String, i64)> {
        let ev: Vec<Value> = serde_json::from_slice(bytes).unwrap();
        let names: std::collections::HashMap<i64, String> = ev
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
            .map(|e| (e["pid"].as_i64().unwrap(), e["args"]["name"].as_str().unwrap().to_owned()))
            .collect();
        ev.iter()
            .filter(|e| e["name"] == "gloo:all_reduce")
            .map(|e| {
                (
                    names[&e["pid"].as_i64().unwrap()].clone(),
                    e["ts"].as_i64().unwrap() + e["dur"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    let (ea, eb) = (ends(&members[1].1), ends(&members[2].1));
    assert!(ea.iter().all(|(r, _)| r.contains("-nodea")) && eb.iter().all(|(r, _)| r.contains("-nodeb")));
    assert_eq!((ea.len(), eb.len()), (2 * (STEPS * PER_STEP) as usize, 2 * (STEPS * PER_STEP) as usize));
    let (ma, mb) = (ea.iter().map(|e| e.1).min().unwrap(), eb.iter().map(|e| e.1).min().unwrap());
    assert!((mb - ma - SHIFT_US).abs() < 1000, "{}", mb - ma);
    assert_eq!(a.files.len(), 2);
}
