//! NCCL Inspector's per-process files (`docs/report.md`, "NCCL Inspector"; the format:
//! docs/formats.md, "NCCL Inspector") written here as the plugin writes them: two ranks of one
//! communicator with a rank planted slow, a pretty-printed file, and hostile files that must
//! stay bounded and never fail the report; and the same in its Prometheus mode's text files.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::Path;

use serde_json::{Value, json};
use trainprof_report::reading::inspector::{
    self, MAX_RECORD_BYTES, parse_prom_line, prom_size, split_objects,
};
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

/// The three lines Inspector's Prometheus mode writes for one collective (labels in its order).
fn prom_lines(comm: &str, rank: i64, host: &str, gpu: u32, sn: u64, exec_us: u64, busbw: &str) -> String {
    let labels = format!(
        "comm_id=\"{comm}\",hostname=\"{host}\",rank=\"{rank}\",slurm_job=\"unknown\",slurm_job_id=\"unknown\",\
         nranks=\"2\",n_nodes=\"2\",gpu_device_id=\"GPU{gpu}\",collective=\"AllReduce\",coll_sn=\"{sn}\",\
         timestamp=\"2026-11-28T03:31:47Z\",message_size=\"2.00MB\""
    );
    format!(
        "nccl_algorithm_bandwidth_gbs{{{labels}}} 20\nnccl_bus_bandwidth_gbs{{{labels}}} {busbw}\n\
         nccl_collective_exec_time_microseconds{{{labels}}} {exec_us}\n"
    )
}

/// Two GPUs' files of one communicator in the Prometheus mode, the second rank 5× slower: read
/// into the same records as the JSON mode's, matched by (comm_id, coll_sn), the slow one named.
#[test]
fn prometheus_mode_files_are_read_and_matched() {
    let t = tempfile::tempdir().unwrap();
    write_system(t.path());
    let d = inspector_dir(t.path());
    for (rank, host, us) in [(0, "node-a", 200u64), (1, "node-b", 1000)] {
        let mut text = "# HELP nccl_bus_bandwidth_gbs not written by Inspector, read around\n\n".to_owned();
        for sn in 0..6 {
            text += &prom_lines("0xd152c00f111816", rank, host, rank as u32, sn, us + sn, "40");
        }
        std::fs::write(d.join(format!("nccl_inspector_metrics_GPU-{rank}a2b-77.prom")), text).unwrap();
    }
    let m = build(t.path(), "job", &Options::default()).unwrap();
    let i = m.nccl_inspector.as_ref().expect("nccl_inspector");
    assert_eq!((i.files, i.records, i.bad_records, i.matched), (2, 12, 0, 6));
    assert_eq!((i.communicators[0].id.as_str(), i.communicators[0].n_ranks), ("0xd152c00f111816", 2));
    let slow = i.slowest.as_ref().unwrap();
    assert_eq!((slow.host.as_str(), slow.pid, slow.rank, slow.longest), ("node-b", None, Some(1), 6));
    let b = i.per_rank.iter().find(|r| r.host == "node-b").unwrap();
    let expected_ms: f64 = (0..6).map(|sn| (1000 + sn) as f64 / 1000.0).sum();
    assert!((b.gpu_time_ms - expected_ms).abs() < 1e-9);
    assert_eq!((b.bytes, b.mean_busbw_gbs, b.kinds.get("AllReduce")), (6 * (2 << 20), Some(40.0), Some(&6)));
    assert_eq!(i.exec_spread_ms.max_ms, Some(0.8));
    assert!(page::render(&m).contains("Most execution time: rank 1 (node-b pid ?)"));
}

/// Bad lines are skipped and counted, never held whole: garbage, a line over 64 KiB, a
/// collective without its execution time, a `NaN` bandwidth (no bandwidth), a cut last line,
/// binary garbage; names cut; a file that is no Inspector name is left alone.
#[test]
fn prometheus_mode_bad_lines_are_counted_and_bounded() {
    let t = tempfile::tempdir().unwrap();
    write_system(t.path());
    let d = inspector_dir(t.path());
    let mut text = prom_lines("0x1", 0, &"h".repeat(1000), 0, 1, 100, "NaN");
    text += "garbage here\n";
    text += &format!(
        "nccl_bus_bandwidth_gbs{{comm_id=\"{}\",rank=\"0\",coll_sn=\"2\"}} 1\n",
        "x".repeat(MAX_RECORD_BYTES * 4)
    );
    // Only a bandwidth for sn 3: no execution time.
    text += "nccl_bus_bandwidth_gbs{comm_id=\"0x1\",rank=\"0\",coll_sn=\"3\"} 1\n";
    text += &prom_lines("0x1", 0, "h", 0, 4, 300, "2.5");
    let cut = prom_lines("0x1", 0, "h", 0, 5, 400, "1");
    text += &cut[..cut.len() - 5];
    std::fs::write(d.join("nccl_inspector_metrics_GPU-0.prom"), text).unwrap();
    let binary: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
    // Every line of it is skipped (none is the text format), the cut last one too.
    let binary_lines = binary.split(|b| *b == b'\n').count() as u64;
    std::fs::write(d.join("nccl_inspector_metrics_GPU-1.prom"), binary).unwrap();
    std::fs::write(d.join("metrics.prom"), prom_lines("0x9", 0, "h", 0, 1, 1, "1")).unwrap();
    let m = build(t.path(), "job", &Options::default()).unwrap();
    let i = m.nccl_inspector.unwrap();
    assert_eq!(i.files, 2);
    // sn 1 and 4 read; skipped: the garbage, the long line, sn 3 (no time), sn 5's cut last
    // line and so sn 5 (no time).
    assert_eq!((i.records, i.bad_records), (2, 5 + binary_lines));
    let p = i.per_rank.iter().find(|r| r.collectives == 2).unwrap();
    assert_eq!(p.mean_busbw_gbs, Some(2.5));
    assert!(p.host.len() <= inspector::MAX_NAME_BYTES + 4, "{}", p.host.len());
    assert!(i.communicators.iter().all(|c| c.id != "0x9"));
}

#[test]
fn the_prometheus_text_format_is_parsed() {
    let (name, labels, value) = parse_prom_line(
        "nccl_bus_bandwidth_gbs{comm_id=\"a\\\"b\",hostname=\"x\\\\y\",rank=\"3\"} 4.5e1 1700000000000",
    )
    .unwrap();
    assert_eq!((name, value), ("nccl_bus_bandwidth_gbs", 45.0));
    assert_eq!(
        labels,
        vec![("comm_id", "a\"b".to_owned()), ("hostname", "x\\y".to_owned()), ("rank", "3".to_owned())]
    );
    assert!(parse_prom_line("m{a=\"1\"} NaN").unwrap().2.is_nan());
    assert_eq!(parse_prom_line("plain 7").unwrap().2, 7.0);
    for bad in
        ["# HELP m x", "", "m{a=\"1} 3", "m{a=1} 3", "m{a=\"1\"}", "m{a=\"1\"} x", "m 1 2 3", "{a=\"1\"} 1"]
    {
        assert!(parse_prom_line(bad).is_none(), "{bad}");
    }
    let many = (0..100).map(|i| format!("l{i}=\"v\"")).collect::<Vec<_>>().join(",");
    assert!(parse_prom_line(&format!("m{{{many}}} 1")).is_none());
    assert_eq!(prom_size("512B"), Some(512));
    assert_eq!(prom_size("2.00GB"), Some(2 << 30));
    assert_eq!(prom_size("1.50KB"), Some(1536));
    for bad in ["", "GB", "1.0PB", "-1MB", "1e300GB", "nanGB"] {
        assert_eq!(prom_size(bad), None, "{bad}");
    }
}
