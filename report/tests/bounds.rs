//! The readers of trainer-written files under arbitrary and mutated bytes
//! (`docs/report.md`, "Untrusted input"): no panic, memory within a bound linear in the
//! input (and absolute for the hostile cases), and work within the decoders' own budgets.
//!
//! Memory is measured, not assumed: this test binary's global allocator counts the bytes
//! live on the calling thread, and each check takes the peak while one reader runs. Work is
//! bounded by counters the readers keep (values, frames, events, lines), never by a clock.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::prelude::*;
use trainprof_report::reading::{self as read, marshal, python};

/// Counts the bytes allocated and freed on each thread, and the peak since the last reset.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // `try_with`: a thread being torn down has no counters left; its frees are not ours.
    let _ = LIVE.try_with(|l| {
        let v = l.get() + delta;
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

// SAFETY: every call is passed on to `System` unchanged; the counters only observe it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: `ptr` came from `alloc` / `realloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc` is `System.realloc`'s.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and returns its result and the most bytes it held at once on this thread.
fn peak<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let r = f();
    let top = PEAK.with(Cell::get);
    (r, usize::try_from(top - start).unwrap_or(0))
}

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

fn config() -> ProptestConfig {
    ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() }
}

/// `base` with a few bytes replaced, inserted or removed.
fn mutated(base: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 0..8).prop_map(
        move |edits| {
            let mut b = base.to_vec();
            for (at, byte, op) in edits {
                let i = at.index(b.len() + 1);
                match op {
                    0 if i < b.len() => b[i] = byte,
                    1 => b.insert(i, byte),
                    _ if i < b.len() => {
                        b.remove(i);
                    }
                    _ => {}
                }
            }
            b
        },
    )
}

// ---- marshal (cProfile `python_stats`) ----

/// `marshal.dumps` of a two-row pstats dict, one row with a caller, from CPython 3.11:
/// flagged (interned, shared) values and back-references to strings, ints and a tuple.
const PSTATS: &[u8] = b"\xfb\xa9\x03\xfa\x08train.py\xe9\x0a\x00\x00\x00\xda\x01f)\x05\xe9\x02\x00\x00\x00\xe9\x03\x00\x00\x00\xe7\x00\x00\x00\x00\x00\x00\xe0?\xe7\x00\x00\x00\x00\x00\x00\xf8?{0\xa9\x03r\x02\x00\x00\x00\xe9\x14\x00\x00\x00\xda\x01g)\x05\xe9\x01\x00\x00\x00r\x0c\x00\x00\x00\xe7\x00\x00\x00\x00\x00\x00\xd0?r\x0d\x00\x00\x00{r\x01\x00\x00\x00\xa9\x04r\x0c\x00\x00\x00r\x0c\x00\x00\x00r\x0d\x00\x00\x00r\x0d\x00\x00\x0000";

fn check_marshal(b: &[u8]) {
    let ((r, cost), bytes) = peak(|| {
        let (r, cost) = marshal::decode_counted(b);
        // The pstats view too (it walks only the top dict).
        let _ = marshal::pstats(b);
        (r.map(|_| ()), cost)
    });
    let _ = r;
    // Work: one value per input byte at most (a reference takes five), within the budget.
    assert!(cost.values <= b.len().max(1) && cost.values <= marshal::MAX_VALUES, "{cost:?}");
    // Memory: linear in the input (a value is at most ~100 bytes: its slot, its `Rc`, its
    // reference slot, a growing vector's spare room).
    assert!(bytes <= 128 * b.len() + 16 * KIB, "{bytes} bytes for {} input bytes", b.len());
}

/// Every one-byte input, and a container that ends where its next value should start: a
/// value is counted only once its type byte is read.
#[test]
fn marshal_inputs_cut_where_a_value_starts() {
    for b in 0..=255u8 {
        check_marshal(&[b]);
    }
    for cut in [&b"{"[..], b"{\xda\x01f", b"[\x02\x00\x00\x00", b")\x03\xe9\x01\x00\x00\x00"] {
        check_marshal(cut);
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn marshal_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_marshal(&b);
    }

    #[test]
    fn marshal_mutated_pstats(b in mutated(PSTATS)) {
        check_marshal(&b);
    }
}

#[test]
fn marshal_seed_is_a_real_pstats_file() {
    let rows = marshal::pstats(PSTATS).unwrap();
    assert_eq!(rows.len(), 2);
}

#[test]
fn marshal_hostile_files_stay_within_the_budget() {
    // References that double at each level: 2^40 values if copied.
    let mut b = vec![b'['];
    b.extend_from_slice(&40i32.to_le_bytes());
    b.extend_from_slice(b"\xa9\x02NN");
    for k in 0..39i32 {
        b.extend_from_slice(b"\xa9\x02r");
        b.extend_from_slice(&k.to_le_bytes());
        b.push(b'r');
        b.extend_from_slice(&k.to_le_bytes());
    }
    let ((r, cost), bytes) = peak(|| marshal::decode_counted(&b));
    assert!(r.is_ok() && cost.values < b.len());
    eprintln!("marshal, doubling references ({} bytes): {cost:?}, peak {bytes} bytes", b.len());
    assert!(bytes < 64 * KIB, "{bytes}");
    // As many one-byte values as the budget allows, then one more: refused, and the memory
    // it took is the budget's (about 24 bytes a value, twice while a list grows).
    let n = marshal::MAX_VALUES + 1;
    let mut b = vec![b'['];
    b.extend_from_slice(&i32::try_from(n).unwrap().to_le_bytes());
    b.resize(5 + n, b'N');
    let ((r, _), bytes) = peak(|| marshal::decode_counted(&b));
    eprintln!("marshal, {n} values: peak {bytes} bytes");
    assert_eq!(r, Err(marshal::MarshalError::TooManyValues));
    assert!(bytes <= 64 * MIB, "{bytes}");
}

// ---- pyinstrument (`python_stats.json`) ----

const PYI: &[u8] = br#"{"start_time": 1795400000.5, "duration": 2.0, "root_frame": {"function": "<module>", "file_path_short": "train.py", "file_path": "/w/train.py", "line_no": 1, "time": 3.0, "await_stack": [], "is_application_code": true, "group_id": null, "class_name": null, "children": [{"function": "step", "file_path_short": "train.py", "line_no": 5, "time": 2.0, "children": [{"function": "step", "file_path_short": "train.py", "line_no": 5, "time": 1.5, "children": []}]}]}}"#;

fn check_pyinstrument(b: &[u8]) {
    let ((r, cost), bytes) = peak(|| python::pyinstrument_counted(b));
    if let Ok(f) = &r {
        assert!(f.len() <= python::TOP);
    }
    // Work: a frame is at least `{}`.
    assert!(cost.frames <= b.len() / 2 && cost.frames <= python::MAX_FRAMES, "{cost:?}");
    // Memory: the parser's buffers, and per frame its node, key and names.
    assert!(bytes <= 256 * b.len() + 64 * KIB, "{bytes} bytes for {} input bytes", b.len());
}

/// A random frame tree as pyinstrument writes it.
fn frame_json() -> impl Strategy<Value = String> {
    let leaf = (0u8..4, 0u32..100, 0u32..1000).prop_map(|(f, line, t)| {
        format!(r#"{{"function": "f{f}", "file_path_short": "m.py", "line_no": {line}, "time": {t}e-3, "children": []}}"#)
    });
    leaf.prop_recursive(6, 64, 4, |inner| {
        (0u8..4, 0u32..1000, proptest::collection::vec(inner, 0..4)).prop_map(|(f, t, kids)| {
            format!(
                r#"{{"function": "f{f}", "file_path": "/m.py", "time": {t}, "children": [{}]}}"#,
                kids.join(", ")
            )
        })
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn pyinstrument_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_pyinstrument(&b);
    }

    #[test]
    fn pyinstrument_mutated(b in mutated(PYI)) {
        check_pyinstrument(&b);
    }

    #[test]
    fn pyinstrument_random_trees(tree in frame_json(), edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3)) {
        let mut b = format!(r#"{{"root_frame": {tree}}}"#).into_bytes();
        let clean = edits.is_empty();
        for (at, byte) in edits {
            let i = at.index(b.len());
            b[i] = byte;
        }
        if clean {
            prop_assert!(python::pyinstrument(&b).is_ok());
        }
        check_pyinstrument(&b);
    }
}

#[test]
fn pyinstrument_hostile_files_stay_within_the_budget() {
    // 64 MiB of empty children took 2.7 GB and 11 s as a tree of structs.
    let mut j = br#"{"root_frame": {"function": "r", "time": 1, "children": [{}"#.to_vec();
    while j.len() < 64 * MIB {
        j.extend_from_slice(b",{}");
    }
    j.extend_from_slice(b"]}}");
    let ((r, cost), bytes) = peak(|| python::pyinstrument_counted(&j));
    assert_eq!(r, Err(python::PyinstrumentError::TooManyFrames));
    assert_eq!(cost.frames, python::MAX_FRAMES);
    eprintln!("pyinstrument, 64 MiB of empty children: peak {bytes} bytes");
    assert!(bytes <= 32 * MIB, "{bytes}");
    // Nested as deep as the nesting bound allows: no recursion, memory per level small.
    let mut j = br#"{"root_frame": {"children": "#.to_vec();
    j.extend(std::iter::repeat_n(&br#"[{"children": "#[..], 32_000).flatten());
    let (r, bytes) = peak(|| python::pyinstrument(&j));
    eprintln!("pyinstrument, nested 64,000 deep: peak {bytes} bytes");
    assert!(r.is_err());
    assert!(bytes < 4 * MIB, "{bytes}");
}

// ---- timelines ----

const TIMELINE: &[u8] = br#"[
{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1795316901767630}},
{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},
{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "Forward"}},
{"name": "Net", "pid": 1, "ph": "X", "ts": 3358, "dur": 10000, "args": {"pid": 29945, "step_num": "0"}},
{"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "Step:ModeKeys.TRAIN"}},
{"name": "Step:ModeKeys.TRAIN", "pid": 2, "ph": "X", "ts": 1000, "dur": 41358, "args": {"pid": 29945, "step_num": "0", "a": [1, {"b": null}]}},
{"name": "trainprof:AutoProfilingTrigger", "pid": 2, "ph": "i", "ts": 5000, "args": {"step": 3, "duration_ms": 9.5, "median_ms": 2.5}}
]"#;

fn count_values(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(a) => 1 + a.iter().map(count_values).sum::<usize>(),
        serde_json::Value::Object(o) => 1 + o.values().map(count_values).sum::<usize>(),
        _ => 1,
    }
}

fn check_timeline(b: &[u8]) {
    let ((_, cost), bytes) = peak(|| {
        read::read_timeline(b, "0-algo-1", &mut |e| {
            assert!(read::plausible_us(e.start_us) && read::plausible_us(e.start_us + e.dur_us));
            assert!(e.dur_us >= 0 && e.args.len() <= read::MAX_ARGS);
            assert!(e.args.values().map(count_values).sum::<usize>() <= read::MAX_ARG_VALUES);
        })
    });
    // Work: an event is at least `{}` and a comma.
    assert!(cost.events <= b.len() as u64 / 2, "{cost:?}");
    assert!(cost.largest_event <= read::MAX_EVENT_BYTES + 1, "{cost:?}");
    assert!(bytes <= 64 * b.len() + 64 * KIB, "{bytes} bytes for {} input bytes", b.len());
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn timeline_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_timeline(&b);
    }

    #[test]
    fn timeline_mutated(b in mutated(TIMELINE)) {
        check_timeline(&b);
    }
}

#[test]
fn timeline_seed_reads_its_events() {
    let mut n = 0;
    let (r, cost) = read::read_timeline(TIMELINE, "0-algo-1", &mut |_| n += 1);
    assert_eq!((r, n, cost.events), (Ok(()), 3, 3));
}

#[test]
fn timeline_hostile_event_stays_within_the_event_bound() {
    // One event of 5 M arg keys (54 MB) took 745 MB.
    let mut b =
        br#"[{"name": "a", "pid": 1, "ph": "X", "ts": 1795400000000000, "dur": 1, "args": {"x": 0"#.to_vec();
    for i in 0..5_000_000u32 {
        b.extend_from_slice(format!(",\"{i}\":0").as_bytes());
    }
    b.extend_from_slice(b"}}]");
    let ((r, _), bytes) = peak(|| read::read_timeline(&b[..], "0-algo-1", &mut |_| {}));
    eprintln!("timeline, 5 M arg keys ({} bytes): peak {bytes} bytes", b.len());
    assert!(r.is_err());
    assert!(bytes < MIB, "{bytes}");
}

// ---- system lines ----

const SYSTEM: &[u8] = br#"{"Type":"cpu","Name":"cpu0","Dimension":"CPUUtilization","Value":12.35,"NodeId":"algo-1","Timestamp":1795455620.5}
{"Type":"gpu","Name":"gpu0","Dimension":"GPUUtilization","Value":50,"NodeId":"algo-1","Timestamp":1795455620.5}
{"Type":"host","Name":"AllCores","Dimension":"BusyPercent","Value":40,"NodeId":"algo-1","Timestamp":1795455620.5}
{"Type":"cpu","Name":"cpu0","Dimension":"CPUUtilization","Value":13,"NodeId":"algo-1","Timestamp":1795455620.6}
"#;

fn check_system(b: &[u8]) {
    let ((_, cost), bytes) = peak(|| {
        read::read_system(b, &mut |_, t| {
            assert!(read::plausible_s(t.t_s));
            assert!(t.cores.len() <= read::MAX_TICK_CORES && t.gpus.len() <= read::MAX_TICK_GPUS);
        })
    });
    // Work: one pass, a line at least a byte.
    assert!(cost.lines <= b.len() as u64, "{cost:?}");
    assert!(bytes <= 64 * b.len() + 256 * KIB, "{bytes} bytes for {} input bytes", b.len());
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn system_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_system(&b);
    }

    #[test]
    fn system_mutated(b in mutated(SYSTEM)) {
        check_system(&b);
    }
}

#[test]
fn system_seed_reads_its_ticks() {
    let mut ticks = Vec::new();
    let (r, cost) = read::read_system(SYSTEM, &mut |_, t| ticks.push(t));
    assert!(r.is_ok());
    assert_eq!((ticks.len(), cost.lines, cost.bad), (2, 4, 0));
    assert_eq!(ticks[0].gpus.len(), 1);
}

#[test]
fn system_hostile_tick_stays_within_the_caps() {
    // 100,000 distinct GPUs in one tick: a quadratic search and an unbounded tick before.
    let mut b = Vec::new();
    for i in 0..100_000 {
        b.extend_from_slice(
            format!("{{\"Type\":\"gpu\",\"Name\":\"gpu{i}\",\"Dimension\":\"GPUUtilization\",\"Value\":1,\"NodeId\":\"n\",\"Timestamp\":1795455620}}\n")
                .as_bytes(),
        );
    }
    let ((r, cost), bytes) =
        peak(|| read::read_system(&b[..], &mut |_, t| assert_eq!(t.gpus.len(), read::MAX_TICK_GPUS)));
    assert!(r.is_ok());
    assert_eq!(cost.dropped, 100_000 - read::MAX_TICK_GPUS as u64);
    eprintln!("system, 100,000 GPUs in a tick: peak {bytes} bytes");
    assert!(bytes < MIB, "{bytes}");
}
