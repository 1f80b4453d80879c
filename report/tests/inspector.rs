//! NCCL Inspector's per-process files (`docs/report.md`, "NCCL Inspector"; the format:
//! docs/formats.md, "NCCL Inspector") written here as the plugin writes them: two ranks of one
//! communicator with a rank planted slow, a pretty-printed file, and hostile files that must
//! stay bounded and never fail the report.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::Path;

use serde_json::{Value, json};
use trainprof_report::reading::inspector::{self, MAX_RECORD_BYTES, split_objects};
use trainprof_report::{Options, build, page, to_json};

fn write_system(root: &Path) {
    let d = root.join("system/incremental/2026112203");
    std::fs::create_dir_all(&d).unwrap();
    let line = |t: f64| {
        format!(
            "{{\"Type\":\"cpu\",\"Name\":\"cpu0\",\"Dimension\":\"CPUUtilization\",\"Value\":5,\"NodeId\":\"algo-1\",\"Timestamp\":{t}}}\n"
        )
    };
    std::fs::write(d.join("1795400000.algo-1.json"), line(1_795_400_000.0) + &line(1_795_400_001.0)).unwrap();
}

#[allow(clippy::too_many_arguments)]
fn record(
    comm: &str,
    rank: i64,
    host: &str,
    pid: u64,
    kind: &str,
    sn: u64,
    exec_us: u64,
    busbw: f64,
) -> Value {
    json!({
        "header": {"id": comm, "rank": rank, "n_ranks": 2, "nnodes": 2},
        "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "", "rec_mechanism": "nccl_profiler_interface",
                     "dump_timestamp_us": 1_795_400_000_000_000u64 + sn, "hostname": host, "pid": pid},
        "coll_perf": {"coll": kind, "coll_sn": sn, "coll_msg_size_bytes": 1u64 << 20, "coll_exec_time_us": exec_us,
                      "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": busbw / 2.0, "coll_busbw_gbs": busbw,
                      "event_trace_sn": {"coll_start_sn": 1, "kernel_events": [{"channel_id": 0}]}}
    })
}

fn inspector_dir(root: &Path) -> std::path::PathBuf {
    let d = root.join(inspector::FOLDER);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Two ranks, 20 collectives each; rank 1's execution time is 5× rank 0's.
fn two_ranks(root: &Path) {
    write_system(root);
    let d = inspector_dir(root);
    for (rank, host, pid, us) in [(0, "node-a", 101u64, 200u64), (1, "node-b", 202, 1000)] {
        let mut text = String::new();
        for sn in 0..20 {
            let kind = if sn % 4 == 0 { "AllGather" } else { "AllReduce" };
            text += &record("0x7f8c496ae9f661", rank, host, pid, kind, sn, us + sn, 40.0).to_string();
            text.push('\n');
        }
        std::fs::write(d.join(format!("{host}-pid{pid}.log")), text).unwrap();
    }
}

#[test]
fn two_ranks_summed_matched_and_the_slow_rank_named() {
    let t = tempfile::tempdir().unwrap();
    two_ranks(t.path());
    let m = build(t.path(), "job", &Options::default()).unwrap();
    let i = m.nccl_inspector.as_ref().expect("nccl_inspector");
    assert_eq!((i.files, i.records, i.bad_records, i.matched), (2, 40, 0, 20));
    assert_eq!(i.communicators.len(), 1);
    assert_eq!(i.communicators[0].processes, 2);
    let slow = i.slowest.as_ref().unwrap();
    assert_eq!((slow.host.as_str(), slow.pid, slow.rank, slow.longest), ("node-b", Some(202), Some(1), 20));
    let b = i.per_rank.iter().find(|r| r.host == "node-b").unwrap();
    let expected_ms: f64 = (0..20).map(|sn| (1000 + sn) as f64 / 1000.0).sum();
    assert!((b.gpu_time_ms - expected_ms).abs() < 1e-9);
    assert_eq!(b.kinds.get("AllGather"), Some(&5));
    assert_eq!(b.kinds.get("AllReduce"), Some(&15));
    assert_eq!(b.mean_busbw_gbs, Some(40.0));
    assert_eq!(i.exec_spread_ms.max_ms, Some(0.8));
    let a = i.per_rank.iter().find(|r| r.host == "node-a").unwrap();
    assert_eq!((a.shortest, a.longest), (20, 0));
    let html = page::render(&m);
    assert!(html.contains("<h3 id=\"nccl-inspector\">NCCL Inspector</h3>"));
    assert!(html.contains("Most execution time: rank 1 (node-b pid 202)"));
    let j: Value = serde_json::from_str(&to_json(&m)).unwrap();
    assert_eq!(j["nccl_inspector"]["slowest"]["pid"], 202);
    assert_eq!(j["nccl_inspector"]["per_rank"].as_array().unwrap().len(), 2);
}

#[test]
fn without_inspector_files_the_key_is_left_out() {
    let t = tempfile::tempdir().unwrap();
    write_system(t.path());
    let m = build(t.path(), "job", &Options::default()).unwrap();
    assert!(m.nccl_inspector.is_none());
    let j: Value = serde_json::from_str(&to_json(&m)).unwrap();
    assert!(j.get("nccl_inspector").is_none());
    assert!(!page::render(&m).contains("NCCL Inspector"));
}

#[test]
fn pretty_printed_objects_and_a_cut_line_are_read_around() {
    let t = tempfile::tempdir().unwrap();
    write_system(t.path());
    let d = inspector_dir(t.path());
    let r = |sn| record("0x1", 0, "h", 7, "AllReduce", sn, 100, 1.0);
    let mut text = serde_json::to_string_pretty(&r(1)).unwrap() + "\n";
    let cut = r(2).to_string();
    text += &cut[..cut.len() / 2];
    text.push('\n');
    text += &(r(3).to_string() + "\ngarbage here\n" + &r(4).to_string() + "\n");
    // Inspector writes a NaN bandwidth as the string "nan"; a bare inf is no JSON.
    text += &r(5).to_string().replace("\"coll_busbw_gbs\":1.0", "\"coll_busbw_gbs\":\"nan\"");
    text += "\n";
    text += &r(6).to_string().replace("\"coll_busbw_gbs\":1.0", "\"coll_busbw_gbs\":inf");
    text += "\n";
    text += &serde_json::to_string_pretty(&r(7)).unwrap()[..40];
    std::fs::write(d.join("h-pid7.log"), text).unwrap();
    let m = build(t.path(), "job", &Options::default()).unwrap();
    let i = m.nccl_inspector.unwrap();
    // 1, 3, 4, 5 read; the cut 2, the garbage, the inf 6 and the cut 7 skipped.
    assert_eq!((i.records, i.bad_records), (4, 4));
    assert_eq!(i.per_rank[0].mean_busbw_gbs, Some(1.0));
    assert!(i.slowest.is_none());
}

#[test]
fn hostile_files_stay_bounded() {
    let t = tempfile::tempdir().unwrap();
    write_system(t.path());
    let d = inspector_dir(t.path());
    // Deep nesting: 10 MB of `[`, never recursed into.
    std::fs::write(d.join("deep-pid1.log"), "{".to_owned() + &"[".repeat(10 << 20)).unwrap();
    // A huge string in one record, and binary garbage.
    let huge = record(&"x".repeat(MAX_RECORD_BYTES * 4), 0, "h", 2, "AllReduce", 1, 1, 1.0).to_string();
    std::fs::write(d.join("huge-pid2.log"), huge + "\n").unwrap();
    std::fs::write(d.join("bin-pid3.log"), (0..=255u8).cycle().take(1 << 20).collect::<Vec<u8>>()).unwrap();
    // 100,000 records of one process, with long names cut.
    let mut f = std::io::BufWriter::new(std::fs::File::create(d.join("many-pid4.log")).unwrap());
    let long = "c".repeat(1000);
    for sn in 0..100_000u64 {
        let comm = if sn % 2 == 0 { long.as_str() } else { "0x2" };
        writeln!(f, "{}", record(comm, 0, &"h".repeat(500), 4, "AllReduce", sn, 10, 2.0)).unwrap();
    }
    f.flush().unwrap();
    drop(f);
    // Not Inspector's names: left alone.
    std::fs::write(d.join("notes.txt"), "x").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", d.join("link-pid5.log")).unwrap();
    let m = build(t.path(), "job", &Options::default()).unwrap();
    let i = m.nccl_inspector.unwrap();
    assert_eq!(i.files, 4);
    assert_eq!(i.records, 100_000);
    assert!(i.bad_records >= 3, "{}", i.bad_records);
    let many = i.per_rank.iter().find(|r| r.pid == Some(4)).unwrap();
    assert!(many.host.len() <= inspector::MAX_NAME_BYTES + 4, "{}", many.host.len());
    assert!(i.communicators.iter().all(|c| c.id.len() <= inspector::MAX_NAME_BYTES + 4));
    assert!(m.job.skipped.iter().any(|s| s.contains("link-pid5.log")), "{:?}", m.job.skipped);
}

#[test]
fn the_splitter_frames_lines_and_pretty_objects() {
    let text = b"{\"a\":\"}{\\\"\"}\n  {\n \"b\": [1,\n2]\n}\nxx{\"c\":1}{\"d\"\n{\"e\":2}";
    let mut got = Vec::new();
    split_objects(&text[..], |o| {
        got.push(o.map(|b| String::from_utf8_lossy(b).into_owned()));
        true
    });
    assert_eq!(
        got,
        vec![
            Ok("{\"a\":\"}{\\\"\"}".to_owned()),
            Ok("{\n \"b\": [1,\n2]\n}".to_owned()),
            Err(()),
            Ok("{\"c\":1}".to_owned()),
            Err(()),
            Ok("{\"e\":2}".to_owned()),
        ]
    );
}

#[test]
fn inspector_files_alone_make_a_report() {
    let t = tempfile::tempdir().unwrap();
    let d = inspector_dir(t.path());
    std::fs::write(d.join("h-pid1.log"), record("0x1", 0, "h", 1, "AllReduce", 1, 5, 1.0).to_string() + "\n")
        .unwrap();
    let m = build(t.path(), "job", &Options::default()).unwrap();
    assert_eq!(m.nccl_inspector.as_ref().unwrap().records, 1);
    assert!(page::render(&m).contains("NCCL Inspector"));
}
