//! The agent's account of its own cost (docs/formats.md, "The agent's own cost") against a
//! known bill: the fake NVML (`tests/c/fake_nvml.c`) charges each call a cost of its table in
//! CPU time, and `trainprof run` must name each call's cost within ±20 % and account for its
//! process's CPU time within 10 %, measured from outside (`wait4`'s rusage).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// µs of CPU per call: each at least 200 µs, so that what the machine adds to a call (the
/// fake's busy loop overshooting, an interrupt charged to the thread) stays a few percent.
const TABLE: &[(&str, f64)] = &[
    ("nvmlDeviceGetUtilizationRates", 300.0),
    ("nvmlDeviceGetPowerUsage", 240.0),
    ("nvmlDeviceGetTemperature", 200.0),
    ("nvmlDeviceGetClockInfo", 200.0),
    ("nvmlDeviceGetCurrentClocksThrottleReasons", 220.0),
    ("nvmlEventSetWait_v2", 200.0),
    ("nvmlDeviceGetMemoryInfo_v2", 260.0),
    ("nvmlDeviceGetComputeRunningProcesses_v3", 280.0),
    ("nvmlDeviceGetSamples", 1500.0),
    ("nvmlDeviceGetProcessUtilization", 900.0),
    ("nvmlGpmSampleGet", 300.0),
    ("nvmlGpmMetricsGet", 700.0),
    ("nvmlDeviceGetFieldValues:186", 200.0),
    ("nvmlDeviceGetFieldValues:83", 3000.0),
    ("nvmlDeviceGetFieldValues:197", 200.0),
    ("nvmlDeviceGetFieldValues:198", 200.0),
];

fn cost(name: &str) -> f64 {
    TABLE.iter().find(|(n, _)| *n == name).map_or(0.0, |(_, us)| *us)
}

/// What each part's call should cost by the table (a part that makes several NVML calls:
/// their sum), over `calls` calls.
fn expected(part: &str, calls: f64) -> Option<f64> {
    Some(match part {
        "nvml.utilization" => cost("nvmlDeviceGetUtilizationRates"),
        "nvml.power" => cost("nvmlDeviceGetPowerUsage"),
        "nvml.temperature" => cost("nvmlDeviceGetTemperature"),
        "nvml.sm_clock" => cost("nvmlDeviceGetClockInfo"),
        "nvml.throttle" => cost("nvmlDeviceGetCurrentClocksThrottleReasons"),
        "nvml.memory" => cost("nvmlDeviceGetMemoryInfo_v2"),
        "nvml.processes" => cost("nvmlDeviceGetComputeRunningProcesses_v3"),
        "nvml.utilization_samples" => 2.0 * cost("nvmlDeviceGetSamples"),
        "nvml.process_utilization" => cost("nvmlDeviceGetProcessUtilization"),
        // A sample each read; the metrics from the second read on (two samples).
        "nvml.gpm" => cost("nvmlGpmSampleGet") + cost("nvmlGpmMetricsGet") * (calls - 1.0) / calls,
        "nvml.instant_fields" => cost("nvmlDeviceGetFieldValues:186"),
        "nvml.fields" => {
            cost("nvmlDeviceGetFieldValues:83")
                + cost("nvmlDeviceGetFieldValues:197")
                + cost("nvmlDeviceGetFieldValues:198")
        }
        // One call a wait.
        "nvml.events" => cost("nvmlEventSetWait_v2"),
        _ => return None,
    })
}

fn build_fake(dir: &Path) -> PathBuf {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/fake_nvml.c");
    let lib = dir.join("libnvidia-ml.so.1");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-DFAKE_NVML_DEVICES=1", "-o"])
        .arg(&lib)
        .arg(src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc (a C compiler is needed for this test): {e}"));
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    lib
}

/// Runs `cmd` to its end; its CPU time (user + system, seconds) from `wait4`.
fn run_measured(cmd: &mut Command) -> (i32, f64) {
    let child = cmd.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 writes into the values we own; `pid` is our child, not yet waited for.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid);
    std::mem::forget(child);
    let s = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    (status, s(ru.ru_utime) + s(ru.ru_stime))
}

#[test]
fn the_agent_names_each_charged_call_and_accounts_for_its_cpu() {
    let t = tempfile::Builder::new().prefix("trainprof-self-cost-").tempdir().unwrap();
    let lib = build_fake(t.path());
    let out = t.path().join("out");
    let table: Vec<String> = TABLE.iter().map(|(n, us)| format!("{n}={us}")).collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainprof"));
    cmd.args(["run", "--interval-ms", "100", "--no-report", "--local-path"])
        .arg(&out)
        .args(["--", "sleep", "4"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TRAINPROF_RESOURCE_CONFIG", "/nonexistent/resourceconfig.json")
        .env("SMPROFILER_CONFIG_PATH", "/nonexistent/profilerconfig.json")
        .env("TRAINPROF_NVML_LIB", &lib)
        .env("FAKE_NVML_COST_US", table.join(","))
        .stderr(std::process::Stdio::null());
    let (status, outside_cpu_s) = run_measured(&mut cmd);
    assert_eq!(status, 0);

    let folder = out.join("system/cost/algo-1");
    let files: Vec<_> = std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let record: Value = serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();
    let parts = record["Parts"].as_array().unwrap();

    // Each charged call's cost, within ±20 %.
    let mut named = Vec::new();
    for p in parts {
        let part = p["Part"].as_str().unwrap();
        let Some(want) = expected(part, p["Calls"].as_f64().unwrap()) else { continue };
        let got = p["MicrosPerCall"].as_f64().unwrap_or_else(|| panic!("{part}: no µs per call: {p}"));
        assert!((got / want - 1.0).abs() <= 0.2, "{part}: {got:.1} µs per call, the table says {want:.1}");
        named.push(part);
    }
    for part in [
        "nvml.utilization",
        "nvml.power",
        "nvml.temperature",
        "nvml.sm_clock",
        "nvml.throttle",
        "nvml.memory",
        "nvml.processes",
        "nvml.utilization_samples",
        "nvml.process_utilization",
        "nvml.gpm",
        "nvml.instant_fields",
        "nvml.fields",
        "nvml.events",
    ] {
        assert!(named.contains(&part), "{part} not in the record: {parts:?}");
    }

    // The parts sum to the process's CPU time: as the agent read it at the record, and as
    // measured from outside at its exit (which adds only the end of the job after it).
    let sum: f64 = parts.iter().map(|p| p["Seconds"].as_f64().unwrap()).sum();
    let cpu = record["CpuSeconds"].as_f64().unwrap();
    assert!((sum / cpu - 1.0).abs() <= 0.1, "parts {sum:.4} s, process {cpu:.4} s: {record}");
    assert!(cpu <= outside_cpu_s + 0.002, "the record's {cpu:.4} s over the outside's {outside_cpu_s:.4} s");
    assert!(
        (sum / outside_cpu_s - 1.0).abs() <= 0.1,
        "parts {sum:.4} s, outside {outside_cpu_s:.4} s: {record}"
    );
    // The accounting's own cost is stated, and small.
    let accounting = record["AccountingSeconds"].as_f64().unwrap();
    assert!(accounting > 0.0 && accounting < 0.02 * cpu, "{accounting} of {cpu}");
}
