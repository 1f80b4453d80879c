//! The `trainprof` binary as users run it.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/tests/fixtures").join(name)
}

/// `trainprof ARGS` with a clean environment for the variables it reads.
fn trainprof(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainprof"));
    cmd.args(args);
    for var in [
        "SMPROFILER_CONFIG_PATH",
        "TRAINPROF_LOCAL_PATH",
        "TRAINPROF_INTERVAL_MS",
        "TRAINPROF_S3_OUTPUT_PATH",
        "TRAINPROF_DISABLE",
        "SM_HPS",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

fn check_json(path: &str, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["config", "check", "--json", path];
    args.extend_from_slice(extra);
    let out = trainprof(&args, &[]);
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.code().unwrap(), v)
}

#[test]
fn json_shape_for_the_sdk_default_config() {
    let path = fixture("sdk_default.json");
    let (code, v) = check_json(path.to_str().unwrap(), &["--steps", "16"]);
    assert_eq!(code, 0);
    assert_eq!(v["enabled"], true);
    assert_eq!(v["interval_ms"], 500);
    assert_eq!(v["local_path"], "/opt/ml/output/profiler/");
    assert_eq!(v["s3_output_path"], "s3://my-training-bucket/job-0001/profiler-output");
    assert_eq!(v["rotate_max_file_size"], 10_485_760);
    assert_eq!(v["rotate_close_interval_s"], 60.0);
    assert_eq!(v["file_open_fail_threshold"], 50);
    let f = &v["features"];
    for (name, start, num, active) in [
        ("detailed", 5, 1, json!([5])),
        ("dataloader", 7, 1, json!([7])),
        ("python", 9, 3, json!([9, 10, 11])),
        ("smdataparallel", 15, 1, json!([15])),
    ] {
        let feature = &f[name];
        assert_eq!(feature["enabled"], true, "{name}");
        assert_eq!(feature["start_step"], start, "{name}");
        assert_eq!(feature["num_steps"], num, "{name}");
        assert_eq!(feature["start_time_s"], Value::Null, "{name}");
        assert_eq!(feature["duration_s"], Value::Null, "{name}");
        assert_eq!(feature["active_steps"], active, "{name}");
    }
    assert_eq!(f["dataloader"]["metrics_regex"], ".*");
    assert_eq!(f["python"]["profiler"], "cprofile");
    assert_eq!(f["python"]["timer"], "default");
    assert_eq!(v["problems"], json!([]));
}

#[test]
fn json_without_steps_has_no_active_steps_and_time_windows_are_null() {
    let path = fixture("sdk_time_range.json");
    let (_, v) = check_json(path.to_str().unwrap(), &[]);
    assert!(v["features"]["detailed"].get("active_steps").is_none());
    let (_, v) = check_json(path.to_str().unwrap(), &["--steps", "4"]);
    let d = &v["features"]["detailed"];
    assert_eq!(d["active_steps"], Value::Null);
    assert_eq!(d["start_time_s"], 1_700_000_000.5);
    assert_eq!(d["duration_s"], 30.0);
    assert_eq!(d["start_step"], Value::Null);
}

#[test]
fn problems_name_the_key() {
    let path = fixture("broken_parts.json");
    let (code, v) = check_json(path.to_str().unwrap(), &[]);
    assert_eq!(code, 0, "the file was read, problems or not");
    let keys: Vec<&str> =
        v["problems"].as_array().unwrap().iter().map(|p| p["key"].as_str().unwrap()).collect();
    assert!(keys.contains(&"ProfilingParameters.DetailedProfilingConfig"), "{keys:?}");
    assert!(v["problems"][0]["message"].as_str().unwrap().contains("50"));
    assert_eq!(v["features"]["detailed"]["enabled"], false);
    assert_eq!(v["features"]["smdataparallel"]["enabled"], true);
}

#[test]
fn text_in_words() {
    let out =
        trainprof(&["config", "check", fixture("sdk_default.json").to_str().unwrap(), "--steps", "13"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "profiling: on",
        "detailed: train steps 5–5",
        "dataloader: steps 7–7, names matching \".*\"",
        "python: steps 9–11, cProfile, timer by step",
        "smdataparallel: steps 15–15",
        "steps 0..12 (evaluated from step 0):",
        "  detailed: 5",
        "  python: 9 (total_time), 10 (cpu_time), 11 (off_cpu_time)",
        "  smdataparallel: none",
        "problems: none",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
    }
    let out = trainprof(&["config", "check", fixture("sdk_time_range.json").to_str().unwrap()], &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("detailed: from 2023-11-14T22:13:20Z (+0.500 s) for 30 s"), "{text}");
}

#[test]
fn unreadable_files_exit_2_with_the_reason() {
    let (code, v) = check_json(fixture("not_json.json").to_str().unwrap(), &[]);
    assert_eq!(code, 2);
    assert_eq!(v["enabled"], false);
    assert_eq!(v["config_file"], "unusable");
    let out = trainprof(&["config", "check", "/nonexistent/profilerconfig.json"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no config file at /nonexistent/profilerconfig.json")
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("built-in defaults"));
}

#[test]
fn environment_and_flags() {
    let path = fixture("sdk_default.json");
    let out = trainprof(
        &["config", "check", "--json", "--interval-ms", "1000", "--local-path", "/flag/out"],
        &[
            ("SMPROFILER_CONFIG_PATH", path.to_str().unwrap()),
            ("TRAINPROF_INTERVAL_MS", "200"),
            ("TRAINPROF_S3_OUTPUT_PATH", "s3://env-bucket/x"),
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["config_path"], path.to_str().unwrap());
    assert_eq!(v["interval_ms"], 1000);
    assert_eq!(v["local_path"], "/flag/out");
    assert_eq!(v["s3_output_path"], "s3://env-bucket/x");

    let p = path.to_str().unwrap();
    for (args, env) in [
        (["config", "check", "--json", p, "--interval-ms", "200"], [("TRAINPROF_DISABLE", "1")]),
        (["config", "check", "--json", p, "--disable", "--s3="], [("TRAINPROF_DISABLE", "0")]),
    ] {
        let out = trainprof(&args, &env);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["enabled"], false, "{args:?} {env:?}");
        assert_eq!(v["features"]["detailed"]["enabled"], false);
    }
}
