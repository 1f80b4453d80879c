//! The config crate against fixture files of our own: the window table of docs/formats.md, "Window resolution", the
//! config-parser cases smdebug's own tests check, the shapes the SageMaker SDK writes, trainprof's deliberate
//! differences from smdebug, overrides and reload, and a property test over arbitrary
//! input.

#![allow(clippy::unwrap_used, clippy::type_complexity)]

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use trainprof_config::{
    CProfileTimer, Config, FileStatus, Loader, Off, OverrideKey, PythonProfiler, Range, Reload, Sources,
    Step, from_bytes, load,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn load_fixture(name: &str) -> trainprof_config::Loaded {
    load(&Sources::new().with_config_path(fixture(name)))
}

/// A config whose only feature is detailed profiling with this sub-config string.
fn detailed(sub: &str) -> Config {
    let doc = serde_json::json!({"ProfilingParameters": {"DetailedProfilingConfig": sub}});
    from_bytes(doc.to_string().as_bytes(), &Sources::new())
}

fn problem_keys(c: &Config) -> Vec<&str> {
    c.problems.iter().map(|p| p.key.as_str()).collect()
}

/// A scratch directory for files that tests rewrite.
/// Removed when dropped, also when the test fails.
struct Scratch(tempfile::TempDir);

impl Scratch {
    fn new(name: &str) -> Scratch {
        Scratch(tempfile::Builder::new().prefix(&format!("trainprof-config-{name}-")).tempdir().unwrap())
    }

    fn write(&self, name: &str, content: &str) -> PathBuf {
        let path = self.0.path().join(name);
        std::fs::write(&path, content).unwrap();
        path
    }
}

// ---- docs/formats.md, "Window resolution": every row of the example table --------

/// Steps 0..=5 at times 1000..=1005 (one per step), first question at `from`.
fn table_steps(sub: &str, from: u64) -> (Config, Vec<u64>) {
    let mut c = detailed(sub);
    let steps = (from..6).filter(|&s| c.detailed.is_active(Step::At(s), 1000.0 + s as f64)).collect();
    (c, steps)
}

#[test]
fn spec_1_7_table() {
    let rows: &[(&str, u64, &[u64], Option<(Option<u64>, Option<u64>)>, Option<(f64, f64)>)] = &[
        (r#"{"StartStep": 2}"#, 0, &[2], Some((Some(2), Some(3))), None),
        (r#"{"StartStep": 0}"#, 0, &[], None, None),
        (r#"{"StartStep": 0, "NumSteps": 2}"#, 0, &[0, 1], Some((Some(0), Some(2))), None),
        (r#"{"NumSteps": 2}"#, 3, &[3, 4], Some((Some(3), Some(5))), None),
        (r#"{"StartTimeInSecSinceEpoch": 1002}"#, 0, &[2], Some((None, Some(3))), None),
        (
            r#"{"StartTimeInSecSinceEpoch": 1001, "DurationInSeconds": 2}"#,
            0,
            &[1, 2],
            None,
            Some((1001.0, 1003.0)),
        ),
        (r#"{"DurationInSeconds": 2}"#, 0, &[0, 1], None, Some((1000.0, 1002.0))),
        (r#"{"StartStep": 1, "DurationInSeconds": 3}"#, 0, &[], None, None),
        (r#"{"StartStep": 0, "DurationInSeconds": 5}"#, 0, &[0, 1, 2, 3, 4], None, Some((1000.0, 1005.0))),
    ];
    for &(sub, from, want, steps, times) in rows {
        let (c, got) = table_steps(sub, from);
        assert_eq!(got, want, "{sub}");
        let w = c.detailed.window();
        if let Some((start, end)) = steps {
            if start.is_some() {
                assert_eq!(w.start_step(), start, "{sub}");
            }
            assert_eq!(w.end_step(), end, "{sub}");
        }
        if let Some((start, end)) = times {
            assert_eq!((w.start_time(), w.end_time()), (Some(start), Some(end)), "{sub}");
        }
    }
    // The step-and-time row is an error that turns the feature off.
    let c = detailed(r#"{"StartStep": 1, "DurationInSeconds": 3}"#);
    assert_eq!(c.detailed.off_reason(), Some(Off::Invalid));
    assert_eq!(problem_keys(&c), ["ProfilingParameters.DetailedProfilingConfig"]);
}

// ---- smdebug's config-parser test cases -----------------------------------------

const NOW: f64 = 1_700_000_000.0;

#[test]
fn detailed_profiling_ranges() {
    // (sub-config, active at step 3 / now, (start_step, end_step), (start_time, end_time))
    type Case = (String, bool, Option<(Option<u64>, Option<u64>)>, Option<(Option<f64>, Option<f64>)>);
    let t = NOW;
    let cases: Vec<Case> = vec![
        (r#"{"StartStep": 3, "NumSteps": 2}"#.into(), true, Some((Some(3), Some(5))), None),
        (r#"{"StartStep": 3}"#.into(), true, Some((Some(3), Some(4))), None),
        (r#"{"NumSteps": 2}"#.into(), true, Some((Some(3), Some(5))), None),
        (
            format!(r#"{{"StartTimeInSecSinceEpoch": {t}, "DurationInSeconds": 500}}"#),
            true,
            None,
            Some((Some(t), Some(t + 500.0))),
        ),
        (format!(r#"{{"StartTimeInSecSinceEpoch": {t}}}"#), true, Some((None, Some(4))), None),
        (r#"{"DurationInSeconds": 500}"#.into(), true, None, Some((Some(NOW), Some(NOW + 500.0)))),
        (r#"{"StartStep": 1}"#.into(), false, Some((Some(1), Some(2))), None),
        (
            format!(r#"{{"StartTimeInSecSinceEpoch": {}, "DurationInSeconds": 500}}"#, t - 1000.0),
            false,
            None,
            Some((Some(t - 1000.0), Some(t - 500.0))),
        ),
    ];
    for (sub, active, steps, times) in cases {
        let mut c = detailed(&sub);
        assert!(c.detailed.is_enabled(), "{sub}");
        assert_eq!(c.detailed.is_active(Step::At(3), NOW), active, "{sub}");
        let w = c.detailed.window();
        if let Some((s, e)) = steps {
            if s.is_some() {
                assert_eq!(w.start_step(), s, "{sub}");
            }
            assert_eq!(w.end_step(), e, "{sub}");
        }
        if let Some((s, e)) = times {
            assert_eq!((w.start_time(), w.end_time()), (s, e), "{sub}");
        }
    }
    let mut c = detailed(&format!(r#"{{"StartStep": 3, "StartTimeInSecSinceEpoch": {t}}}"#));
    assert!(!c.detailed.is_enabled());
    assert!(!c.detailed.is_active(Step::At(3), NOW));
}

fn dataloader(sub: &str) -> Config {
    let doc = serde_json::json!({"ProfilingParameters": {"DataloaderProfilingConfig": sub}});
    from_bytes(doc.to_string().as_bytes(), &Sources::new())
}

#[test]
fn dataloader_profiling_ranges() {
    let mut c = dataloader(r#"{"StartStep": 3, "MetricsRegex": "Dataloader:Event"}"#);
    assert!(c.dataloader.is_active_for("Dataloader:Event1", Step::At(3), NOW));
    assert_eq!(c.dataloader.feature.window().end_step(), Some(4));
    assert_eq!(c.dataloader.metrics_regex, "Dataloader:Event", "the regex keeps its case");

    // The name does not match: inactive, and nothing is resolved.
    let mut c = dataloader(r#"{"NumSteps": 1, "MetricsRegex": "Dataloader:Event2"}"#);
    assert!(!c.dataloader.is_active_for("Dataloader:Event1", Step::At(3), NOW));
    assert_eq!(c.dataloader.feature.window().start_step(), None);
    assert_eq!(c.dataloader.feature.window().end_step(), None);

    // No regex: ".*", and matching ignores case and is anchored at the start only.
    let mut c = dataloader(r#"{"StartStep": 3}"#);
    assert_eq!(c.dataloader.metrics_regex, ".*");
    assert!(c.dataloader.is_active_for("Dataloader:Event1", Step::At(3), NOW));
    let c = dataloader(r#"{"StartStep": 3, "MetricsRegex": "dataloaderiter"}"#);
    assert!(c.dataloader.matches_name("DataLoaderIter::GetNext"));
    assert!(!c.dataloader.matches_name("x DataLoaderIter"));

    // A pattern cannot escape the start anchor (Python's re rejects this one too).
    let c = dataloader(r#"{"StartStep": 3, "MetricsRegex": "x)|(?:y"}"#);
    assert_eq!(c.dataloader.feature.off_reason(), Some(Off::Invalid));
    assert!(!c.dataloader.matches_name("zzzy"));

    // An invalid regex turns dataloader profiling off.
    let mut c = dataloader(r#"{"StartStep": 3, "MetricsRegex": "*"}"#);
    assert_eq!(c.dataloader.feature.off_reason(), Some(Off::Invalid));
    assert!(!c.dataloader.is_active_for("Dataloader:Event1", Step::At(3), NOW));
    assert_eq!(problem_keys(&c), ["ProfilingParameters.DataloaderProfilingConfig.MetricsRegex"]);
}

fn python(sub: &str) -> Config {
    let doc = serde_json::json!({"ProfilingParameters": {"PythonProfilingConfig": sub}});
    from_bytes(doc.to_string().as_bytes(), &Sources::new())
}

#[test]
fn python_profiling_ranges() {
    for (timer, want) in [
        ("total_time", CProfileTimer::TotalTime),
        ("cpu_time", CProfileTimer::CpuTime),
        ("off_cpu_time", CProfileTimer::OffCpuTime),
        ("default", CProfileTimer::Default),
    ] {
        let c =
            python(&format!(r#"{{"StartStep": 3, "ProfilerName": "cprofile", "cProfileTimer": "{timer}"}}"#));
        assert_eq!(c.python.timer, Some(want));
    }
    let mut c = python(r#"{"StartStep": 3, "NumSteps": 2}"#);
    assert_eq!(
        (c.python.profiler, c.python.timer),
        (PythonProfiler::CProfile, Some(CProfileTimer::TotalTime))
    );
    assert!(c.python.feature.is_active(Step::At(3), NOW));

    let c = python(r#"{"StartStep": 3, "ProfilerName": "pyinstrument", "cProfileTimer": "cpu_time"}"#);
    assert_eq!((c.python.profiler, c.python.timer), (PythonProfiler::Pyinstrument, None));

    // Name and timer without a range: enabled, never active.
    let mut c = python(r#"{"ProfilerName": "cprofile", "cProfileTimer": "cpu_time"}"#);
    assert!(c.python.feature.is_enabled());
    assert!(!c.python.feature.is_active(Step::At(3), NOW));
    assert_eq!(c.python.feature.window().range(), Range::Never);

    for bad in
        [r#"{"StartStep": 3, "ProfilerName": "yappi"}"#, r#"{"StartStep": 3, "cProfileTimer": "wall"}"#]
    {
        let mut c = python(bad);
        assert_eq!(c.python.feature.off_reason(), Some(Off::Invalid), "{bad}");
        assert!(!c.python.feature.is_active(Step::At(3), NOW));
        assert_eq!(c.problems.len(), 1, "{bad}: {:?}", c.problems);
    }
}

#[test]
fn python_step_any_before_step_zero() {
    let mut c = python(r#"{"StartStep": 9, "NumSteps": 3}"#);
    assert!(c.python.feature.is_active(Step::Any, NOW));
    assert_eq!(c.python.timer.unwrap().for_window_start(Step::Any), CProfileTimer::TotalTime);
}

#[test]
fn smdataparallel_profiling_ranges() {
    let doc = r#"{"ProfilingParameters": {"SMDataParallelProfilingConfig": "{\"StartStep\": 5, \"NumSteps\": 2}"}}"#;
    let mut c = from_bytes(doc.as_bytes(), &Sources::new());
    assert!(c.smdataparallel.is_enabled());
    assert!(!c.smdataparallel.is_active(Step::At(3), NOW));
    assert!(c.smdataparallel.is_active(Step::At(5), NOW));
}

fn framework_off(c: &Config) -> bool {
    !c.detailed.is_enabled()
        && !c.dataloader.feature.is_enabled()
        && !c.python.feature.is_enabled()
        && !c.smdataparallel.is_enabled()
}

#[test]
fn disabled_profiler() {
    // No file: system monitoring on with defaults, framework features off (smdebug: all off).
    let l = load(&Sources::new().with_config_path(fixture("no-such-file.json")));
    assert_eq!(l.file, FileStatus::Missing);
    assert!(l.config.enabled && framework_off(&l.config));
    assert!(l.config.problems.is_empty());

    // Not JSON: everything off, one problem line.
    let l = load_fixture("not_json.json");
    assert!(matches!(l.file, FileStatus::Unusable(_)));
    assert!(!l.config.enabled && framework_off(&l.config));
    assert_eq!(problem_keys(&l.config), ["file"]);

    // Empty ProfilingParameters: framework off, system monitoring on, other keys still read.
    let l = load_fixture("empty_params.json");
    assert!(l.config.enabled && framework_off(&l.config));
    assert_eq!(l.config.interval_ms, 1000);
    assert!(l.config.problems.is_empty());

    // A top-level array is JSON, but not a config.
    let c = from_bytes(b"[1, 2]", &Sources::new());
    assert!(!c.enabled);
}

#[test]
fn default_trace_file_values() {
    let c = from_bytes(br#"{"ProfilingParameters": {"LocalPath": "/tmp/x"}}"#, &Sources::new());
    assert_eq!(
        (c.file_open_fail_threshold, c.rotate_max_file_size, c.rotate_close_interval_s),
        (50, 10_485_760, 60.0)
    );
    assert_eq!(c.interval_ms, 500);
    assert_eq!(c.s3_output_path, None);
}

#[test]
fn string_data_in_config() {
    let l = load_fixture("string_scalars.json");
    let c = &l.config;
    assert_eq!(l.file, FileStatus::Read);
    assert_eq!(
        (c.rotate_max_file_size, c.rotate_close_interval_s, c.file_open_fail_threshold),
        (1000, 0.5, 3)
    );
    assert_eq!(c.interval_ms, 200);
    // Step and time fields together: detailed off; quoted numbers in the others are read.
    assert_eq!(c.detailed.off_reason(), Some(Off::Invalid));
    assert_eq!(c.smdataparallel.window().range(), Range::Steps { start: Some(6), num: Some(2) });
    assert_eq!(
        c.python.feature.window().range(),
        Range::Time { start: Some(1_700_000_000.25), duration: Some(2.5) }
    );
    assert_eq!(problem_keys(c), ["ProfilingParameters.DetailedProfilingConfig"]);
}

#[test]
fn invalid_string_data_in_config() {
    let c = load_fixture("none_strings.json").config;
    assert!(c.enabled);
    assert_eq!(
        (c.rotate_max_file_size, c.rotate_close_interval_s, c.file_open_fail_threshold),
        (10_485_760, 60.0, 50)
    );
    // Unlike smdebug, the good LocalPath is kept: a bad value resets only its own key.
    assert_eq!(c.local_path, "/tmp/none-strings");
    assert_eq!(c.detailed.off_reason(), Some(Off::Invalid));
    assert_eq!(c.detailed.window().start_step(), None);
    assert_eq!(
        problem_keys(&c),
        [
            "ProfilingParameters.RotateMaxFileSizeInBytes",
            "ProfilingParameters.RotateFileCloseIntervalInSeconds",
            "ProfilingParameters.FileOpenFailThreshold",
            "ProfilingParameters.ProfilerEnabled",
            "ProfilingParameters.DetailedProfilingConfig.StartStep",
            "ProfilingParameters.DetailedProfilingConfig.NumSteps",
            "ProfilingParameters.DetailedProfilingConfig.StartTimeInSecSinceEpoch",
            "ProfilingParameters.DetailedProfilingConfig.DurationInSeconds",
        ],
        "one line per bad scalar, one for the legacy key, one per bad key of the sub-config"
    );
}

#[test]
fn case_insensitive_keys_values_keep_case() {
    let mut c = load_fixture("mixed_case.json").config;
    assert_eq!(c.local_path, "/data/Profiler/Run-A");
    assert_eq!(
        (c.rotate_max_file_size, c.rotate_close_interval_s, c.file_open_fail_threshold),
        (2048, 2.0, 7)
    );
    assert_eq!(c.detailed.window().range(), Range::Steps { start: Some(4), num: Some(2) });
    assert_eq!(c.dataloader.metrics_regex, "DataLoaderIter::GetNext");
    assert!(c.dataloader.is_active_for("dataloaderiter::getnext", Step::At(1), NOW));
    assert_eq!((c.python.profiler, c.python.timer), (PythonProfiler::CProfile, Some(CProfileTimer::CpuTime)));
    assert!(c.problems.is_empty(), "{:?}", c.problems);
}

#[test]
fn update_step_config_on_reload() {
    let dir = Scratch::new("reload-step");
    let path =
        dir.write("p.json", r#"{"ProfilingParameters": {"DetailedProfilingConfig": "{\"NumSteps\": 2}"}}"#);
    let mut loader = Loader::new(Sources::new().with_config_path(&path));
    assert_eq!(loader.config().detailed.window().start_step(), None);
    assert!(loader.config_mut().detailed.is_active(Step::At(5), NOW));
    assert_eq!(loader.config().detailed.window().start_step(), Some(5));

    assert_eq!(loader.reload(), Reload::Unchanged);
    assert_eq!(
        loader.config().detailed.window().start_step(),
        Some(5),
        "unchanged file keeps the resolved start"
    );
    assert!(loader.config_mut().detailed.is_active(Step::At(6), NOW));
    assert!(!loader.config_mut().detailed.is_active(Step::At(7), NOW));

    dir.write(
        "p.json",
        r#"{"ProfilingParameters": {"DetailedProfilingConfig": "{\"StartStep\": 10, \"NumSteps\": 5}"}}"#,
    );
    assert_eq!(loader.reload(), Reload::Changed);
    assert_eq!(loader.config().detailed.window().range(), Range::Steps { start: Some(10), num: Some(5) });
}

#[test]
fn update_time_config_on_reload() {
    let dir = Scratch::new("reload-time");
    let path = dir.write(
        "p.json",
        r#"{"ProfilingParameters": {"DetailedProfilingConfig": "{\"DurationInSeconds\": 0.1}"}}"#,
    );
    let mut loader = Loader::new(Sources::new().with_config_path(&path));
    assert_eq!(loader.config().detailed.window().start_time(), None);
    assert!(loader.config_mut().detailed.is_active(Step::At(0), 1234.5));
    assert_eq!(loader.config().detailed.window().start_time(), Some(1234.5));
    assert_eq!(loader.reload(), Reload::Unchanged);
    assert_eq!(loader.config().detailed.window().start_time(), Some(1234.5));

    dir.write(
        "p.json",
        r#"{"ProfilingParameters": {"DetailedProfilingConfig": "{\"StartTimeInSecSinceEpoch\": 1700000000, \"DurationInSeconds\": 5}"}}"#,
    );
    assert_eq!(loader.reload(), Reload::Changed);
    let w = loader.config().detailed.window();
    assert_eq!((w.start_time(), w.end_time()), (Some(1_700_000_000.0), Some(1_700_000_005.0)));
}

#[test]
fn update_disabled_to_enabled_on_reload() {
    let dir = Scratch::new("reload-enable");
    let path = dir.write("p.json", r#"{"DisableProfiler": true}"#);
    let mut loader = Loader::new(Sources::new().with_config_path(&path));
    assert!(!loader.config().enabled);
    dir.write("p.json", r#"{"ProfilingParameters": {"DetailedProfilingConfig": "{\"StartStep\": 2}"}}"#);
    assert_eq!(loader.reload(), Reload::Changed);
    assert!(loader.config().enabled && loader.config().detailed.is_enabled());
}

#[test]
fn reload_when_the_file_goes_and_comes_back() {
    let dir = Scratch::new("reload-gone");
    let content = r#"{"ProfilingParameters": {"DetailedProfilingConfig": "{\"StartStep\": 2}"}}"#;
    let path = dir.write("p.json", content);
    let mut loader = Loader::new(Sources::new().with_config_path(&path));
    assert!(loader.config().detailed.is_enabled());
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loader.reload(), Reload::Changed);
    assert_eq!(loader.loaded().file, FileStatus::Missing);
    assert!(loader.config().enabled && framework_off(loader.config()));
    assert_eq!(loader.reload(), Reload::Unchanged);
    // smdebug would not notice the same content coming back; we do.
    dir.write("p.json", content);
    assert_eq!(loader.reload(), Reload::Changed);
    assert!(loader.config().detailed.is_enabled());
}

#[test]
fn model_parallel_turns_detailed_off() {
    let sub = r#"{"ProfilingParameters": {"DetailedProfilingConfig": "{\"StartStep\": 2}"}}"#;
    let env = |hps: &'static str| move |k: &str| (k == "SM_HPS").then(|| hps.to_owned());
    let c = from_bytes(sub.as_bytes(), &Sources::from_env(env(r#"{"mp_parameters":{"partitions": 2}}"#)));
    assert_eq!(c.detailed.off_reason(), Some(Off::ModelParallel));
    assert_eq!(problem_keys(&c), ["env:SM_HPS"]);
    let c = from_bytes(sub.as_bytes(), &Sources::from_env(env("{}")));
    assert!(c.detailed.is_enabled());
}

// ---- the shapes the SageMaker SDK writes ------------------------------------------

fn steps_of(f: &mut trainprof_config::Feature, n: u64) -> Vec<u64> {
    (0..n).filter(|&s| f.is_active(Step::At(s), NOW)).collect()
}

#[test]
fn sdk_default_framework_profile() {
    let l = load_fixture("sdk_default.json");
    let mut c = l.config;
    assert_eq!(l.file, FileStatus::Read);
    assert!(c.enabled);
    assert_eq!(c.s3_output_path.as_deref(), Some("s3://my-training-bucket/job-0001/profiler-output"));
    assert_eq!(c.local_path, "/opt/ml/output/profiler/");
    assert_eq!(steps_of(&mut c.detailed, 20), [5]);
    assert_eq!(steps_of(&mut c.dataloader.feature, 20), [7]);
    assert_eq!(steps_of(&mut c.python.feature, 20), [9, 10, 11]);
    assert_eq!(steps_of(&mut c.smdataparallel, 20), [15]);
    assert_eq!(c.python.timer, Some(CProfileTimer::Default));
    assert!(c.problems.is_empty(), "HorovodProfilingConfig is ignored quietly: {:?}", c.problems);
}

#[test]
fn sdk_step_range() {
    let mut c = load_fixture("sdk_step_range.json").config;
    assert_eq!(c.interval_ms, 100);
    for f in [&mut c.detailed, &mut c.dataloader.feature, &mut c.python.feature, &mut c.smdataparallel] {
        assert_eq!(steps_of(f, 10), [3, 4]);
    }
    assert!(c.problems.is_empty());
}

#[test]
fn sdk_time_range_with_duration() {
    // smdebug ignores the SDK's `Duration` (one step at the start time); we read it.
    let mut c = load_fixture("sdk_time_range.json").config;
    let range = Range::Time { start: Some(1_700_000_000.5), duration: Some(30.0) };
    assert_eq!(c.detailed.window().range(), range);
    assert!(!c.detailed.is_active(Step::At(0), 1_700_000_000.0));
    assert!(c.detailed.is_active(Step::At(1), 1_700_000_001.0));
    assert!(c.detailed.is_active(Step::At(2), 1_700_000_030.0));
    assert!(!c.detailed.is_active(Step::At(3), 1_700_000_030.5));
    assert!(c.problems.is_empty());
}

#[test]
fn sdk_per_feature_configs() {
    let mut c = load_fixture("sdk_per_feature.json").config;
    assert_eq!(c.interval_ms, 1000);
    assert_eq!(steps_of(&mut c.detailed, 10), [2, 3, 4]);
    assert!(c.dataloader.is_active_for("DataLoaderIter::GetNext", Step::At(4), NOW));
    assert!(!c.dataloader.matches_name("GetNext"));
    assert_eq!((c.python.profiler, c.python.timer), (PythonProfiler::Pyinstrument, None));
    assert_eq!(steps_of(&mut c.python.feature, 10), [6, 7]);
    assert_eq!(c.smdataparallel.off_reason(), Some(Off::NotConfigured));
}

#[test]
fn sdk_disable_profiler() {
    let c = load_fixture("sdk_disable.json").config;
    assert!(!c.enabled && framework_off(&c));
    for v in [r#""true""#, r#""TRUE""#, "true"] {
        let c = from_bytes(format!(r#"{{"DisableProfiler": {v}}}"#).as_bytes(), &Sources::new());
        assert!(!c.enabled, "{v}");
        assert!(c.problems.is_empty());
    }
    for v in [r#""False""#, "false", "null"] {
        let c = from_bytes(format!(r#"{{"DisableProfiler": {v}}}"#).as_bytes(), &Sources::new());
        assert!(c.enabled, "{v}");
    }
    // Unrecognised: reported, and off (smdebug's truthiness would make "False" mean off).
    for v in [r#""maybe""#, "1", "[]"] {
        let c = from_bytes(format!(r#"{{"DisableProfiler": {v}}}"#).as_bytes(), &Sources::new());
        assert!(!c.enabled, "{v}");
        assert_eq!(problem_keys(&c), ["DisableProfiler"]);
    }
}

// ---- trainprof's own rules ----------------------------------------------------------

#[test]
fn sub_configs_as_json_objects_and_python_literals() {
    let mut c = load_fixture("json_objects.json").config;
    assert_eq!(steps_of(&mut c.detailed, 10), [1, 2]);
    assert!(c.dataloader.is_active_for("Loader", Step::At(4), NOW), "start resolved at the first question");
    assert_eq!(c.python.profiler, PythonProfiler::Pyinstrument);
    assert_eq!(steps_of(&mut c.python.feature, 10), [0, 1, 2, 3]);
    assert_eq!(
        c.smdataparallel.off_reason(),
        Some(Off::NotConfigured),
        "{{}} is not configured, not an error"
    );
    assert!(c.problems.is_empty(), "{:?}", c.problems);

    let doc = r#"{"ProfilingParameters": {"DetailedProfilingConfig": "{'StartStep': 3, 'NumSteps': 2, 'Extra': True}"}}"#;
    let mut c = from_bytes(doc.as_bytes(), &Sources::new());
    assert_eq!(steps_of(&mut c.detailed, 10), [3, 4]);
    assert_eq!(problem_keys(&c), ["ProfilingParameters.DetailedProfilingConfig.Extra"]);
}

#[test]
fn each_broken_part_turns_off_only_itself() {
    let mut c = load_fixture("broken_parts.json").config;
    assert!(c.enabled);
    assert_eq!(c.interval_ms, 500, "50 ms is out of range");
    assert_eq!(c.s3_output_path, None);
    assert_eq!(c.local_path, "/tmp/Keep-My-Case");
    assert_eq!(c.rotate_max_file_size, 10_485_760);
    assert_eq!(c.rotate_close_interval_s, 30.0, "good sibling kept");
    assert_eq!(c.file_open_fail_threshold, 50, "\"2.0\" is not an integer, as in Python");
    assert_eq!(c.detailed.off_reason(), Some(Off::Invalid));
    assert_eq!(c.dataloader.feature.off_reason(), Some(Off::Invalid));
    assert_eq!(c.python.feature.off_reason(), Some(Off::Invalid));
    assert_eq!(steps_of(&mut c.smdataparallel, 20), [15], "the good feature still works");
    assert_eq!(
        problem_keys(&c),
        [
            "ProfilingIntervalInMilliseconds",
            "S3OutputPath",
            "ProfilingParameters.DetaildProfilingConfig",
            "ProfilingParameters.RotateMaxFileSizeInBytes",
            "ProfilingParameters.FileOpenFailThreshold",
            "ProfilingParameters.DetailedProfilingConfig",
            "ProfilingParameters.DataloaderProfilingConfig.MetricsRegex",
            "ProfilingParameters.PythonProfilingConfig.ProfilerName",
        ]
    );
    let unknown = &c.problems[2];
    assert!(unknown.message.contains("unknown key"), "{unknown}");
    let detailed = &c.problems[5];
    assert!(
        detailed.message.contains("not a dict literal") && detailed.message.ends_with("this feature is off")
    );
}

#[test]
fn every_problem_of_a_sub_config_is_listed() {
    let c = detailed(r#"{"StartStep": "x", "NumSteps": "y", "StarStep": 3}"#);
    assert_eq!(c.detailed.off_reason(), Some(Off::Invalid));
    assert_eq!(
        problem_keys(&c),
        [
            "ProfilingParameters.DetailedProfilingConfig.StarStep",
            "ProfilingParameters.DetailedProfilingConfig.StartStep",
            "ProfilingParameters.DetailedProfilingConfig.NumSteps",
        ]
    );
    let doc = serde_json::json!({"ProfilingParameters": {
        "PythonProfilingConfig": r#"{"StartStep": "x", "ProfilerName": "perf", "cProfileTimer": "wall"}"#,
        "DataloaderProfilingConfig": r#"{"NumSteps": "y", "MetricsRegex": "(?<=a)b"}"#,
    }});
    let c = from_bytes(doc.to_string().as_bytes(), &Sources::new());
    assert_eq!(c.python.feature.off_reason(), Some(Off::Invalid));
    assert_eq!(c.dataloader.feature.off_reason(), Some(Off::Invalid));
    assert_eq!(
        problem_keys(&c),
        [
            "ProfilingParameters.DataloaderProfilingConfig.NumSteps",
            "ProfilingParameters.DataloaderProfilingConfig.MetricsRegex",
            "ProfilingParameters.PythonProfilingConfig.StartStep",
            "ProfilingParameters.PythonProfilingConfig.ProfilerName",
            "ProfilingParameters.PythonProfilingConfig.cProfileTimer",
        ]
    );
}

#[test]
fn an_unknown_key_names_the_nearest_known_one() {
    let c = detailed(r#"{"StarStep": 3, "NumStep": 2, "Colour": 1}"#);
    let messages: Vec<&str> = c.problems.iter().map(|p| p.message.as_str()).collect();
    assert_eq!(
        messages[..3],
        [
            "unknown key 'StarStep' in DetailedProfilingConfig; did you mean 'StartStep'? (ignored)",
            "unknown key 'NumStep' in DetailedProfilingConfig; did you mean 'NumSteps'? (ignored)",
            "unknown key 'Colour' in DetailedProfilingConfig, ignored",
        ]
    );
    let c = from_bytes(
        br#"{"DisableProfilr": true, "ProfilingParameters": {"LocalPth": "/x"}}"#,
        &Sources::new(),
    );
    let messages: Vec<&str> = c.problems.iter().map(|p| p.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "unknown key 'DisableProfilr' at the top level; did you mean 'DisableProfiler'? (ignored)",
            "unknown key 'LocalPth' in ProfilingParameters; did you mean 'LocalPath'? (ignored)",
        ]
    );
}

#[test]
fn bad_overrides_are_listed_by_origin() {
    let env = |k: &str| (k == "TRAINPROF_INTERVAL_MS").then(|| "fast".to_owned());
    let s = Sources::from_env(env)
        .with_flag(OverrideKey::IntervalMs, "--interval-ms", "50")
        .with_flag(OverrideKey::S3OutputPath, "--s3", "not-a-url")
        .with_flag(OverrideKey::LocalPath, "--local-path", "/ok");
    let p = trainprof_config::override_problems(&s);
    let lines: Vec<String> = p.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "env:TRAINPROF_INTERVAL_MS: \"fast\" is not an integer",
            "flag:--interval-ms: \"50\" is outside 100..=60000 ms",
            "flag:--s3: \"not-a-url\" does not start with s3://",
        ]
    );
    // `--s3 ''` keeps the files local: valid.
    let ok = Sources::new().with_flag(OverrideKey::S3OutputPath, "--s3", "");
    assert!(trainprof_config::override_problems(&ok).is_empty());
}

#[test]
fn duration_and_zero_hints() {
    let c = detailed(r#"{"StartTimeInSecSinceEpoch": 100, "Duration": 5, "DurationInSeconds": 7}"#);
    assert_eq!(c.detailed.window().range(), Range::Time { start: Some(100.0), duration: Some(7.0) });
    assert_eq!(problem_keys(&c), ["ProfilingParameters.DetailedProfilingConfig.Duration"]);

    let c = detailed(r#"{"StartStep": 0}"#);
    assert!(c.detailed.is_enabled());
    assert_eq!(problem_keys(&c), ["ProfilingParameters.DetailedProfilingConfig.StartStep"]);
    let c = detailed(r#"{"StartStep": 4, "NumSteps": 0}"#);
    assert_eq!(problem_keys(&c), ["ProfilingParameters.DetailedProfilingConfig.NumSteps"]);
    let mut c = detailed(r#"{"StartStep": -1, "NumSteps": 3}"#);
    assert_eq!(steps_of(&mut c.detailed, 5), [0, 1], "Python arithmetic: steps -1, 0, 1");
    assert_eq!(problem_keys(&c), ["ProfilingParameters.DetailedProfilingConfig.StartStep"]);
    let c = detailed(r#"{"StartStep": 2.9}"#);
    assert_eq!(c.detailed.window().range(), Range::Steps { start: Some(2), num: None }, "int(2.9) == 2");
    let c = detailed(r#"{"StartStep": "2.5"}"#);
    assert_eq!(c.detailed.off_reason(), Some(Off::Invalid), "int(\"2.5\") fails in Python too");
}

#[test]
fn out_of_range_scalars_fall_back_one_by_one() {
    for (key, value) in [
        ("RotateMaxFileSizeInBytes", "0"),
        ("RotateMaxFileSizeInBytes", "-5"),
        ("RotateMaxFileSizeInBytes", "\"inf\""),
        ("RotateFileCloseIntervalInSeconds", "0"),
        ("FileOpenFailThreshold", "0"),
        ("FileOpenFailThreshold", "true"),
    ] {
        let doc = format!(r#"{{"ProfilingParameters": {{"LocalPath": "/tmp/k", "{key}": {value}}}}}"#);
        let c = from_bytes(doc.as_bytes(), &Sources::new());
        assert_eq!(
            (c.rotate_max_file_size, c.rotate_close_interval_s, c.file_open_fail_threshold),
            (10_485_760, 60.0, 50),
            "{key}: {value}"
        );
        assert_eq!(c.local_path, "/tmp/k");
        assert_eq!(problem_keys(&c), [format!("ProfilingParameters.{key}")], "{key}: {value}");
    }
    let c = detailed(r#"{"StartStep": true}"#);
    assert_eq!(c.detailed.off_reason(), Some(Off::Invalid), "int(True) is not a step");
}

#[test]
fn keys_are_not_trimmed() {
    // smdebug would not match " StartStep " either: unknown, so no range, never active.
    let c = detailed("{' StartStep ': 5}");
    assert_eq!(c.detailed.window().range(), Range::Never);
    assert!(problem_keys(&c).contains(&"ProfilingParameters.DetailedProfilingConfig. StartStep "));
}

#[test]
fn duplicate_keys_last_wins_and_is_reported() {
    let c = from_bytes(
        br#"{"ProfilingIntervalInMilliseconds": 100, "profilingintervalinmilliseconds": 200}"#,
        &Sources::new(),
    );
    assert_eq!(c.interval_ms, 200);
    assert_eq!(problem_keys(&c), ["ProfilingIntervalInMilliseconds"]);
}

#[test]
fn environment_and_flags_override_the_file() {
    let env = |k: &str| {
        match k {
            "TRAINPROF_LOCAL_PATH" => Some("/env/out"),
            "TRAINPROF_INTERVAL_MS" => Some("200"),
            "TRAINPROF_S3_OUTPUT_PATH" => Some("s3://env-bucket/p"),
            _ => None,
        }
        .map(str::to_owned)
    };
    let file = fixture("sdk_default.json");
    let c = load(&Sources::from_env(env).with_config_path(&file)).config;
    assert_eq!((c.local_path.as_str(), c.interval_ms), ("/env/out", 200));
    assert_eq!(c.s3_output_path.as_deref(), Some("s3://env-bucket/p"));

    let s = Sources::from_env(env)
        .with_config_path(&file)
        .with_flag(OverrideKey::IntervalMs, "--interval-ms", "1000")
        .with_flag(OverrideKey::LocalPath, "--local-path", "/flag/out")
        .with_flag(OverrideKey::S3OutputPath, "--s3", "");
    let c = load(&s).config;
    assert_eq!((c.local_path.as_str(), c.interval_ms, c.s3_output_path), ("/flag/out", 1000, None));

    // A bad override is reported and the value below it stays.
    let s = Sources::new().with_config_path(&file).with_flag(OverrideKey::IntervalMs, "--interval-ms", "5");
    let c = load(&s).config;
    assert_eq!(c.interval_ms, 500);
    assert_eq!(problem_keys(&c), ["flag:--interval-ms"]);
}

#[test]
fn kill_switch_from_the_environment() {
    let file = fixture("sdk_default.json");
    let with = |v: &'static str| {
        load(
            &Sources::from_env(move |k| (k == "TRAINPROF_DISABLE").then(|| v.to_owned()))
                .with_config_path(&file),
        )
        .config
    };
    let c = with("1");
    assert!(!c.enabled && framework_off(&c));
    assert!(with("0").enabled);
    // Set but empty is not set: it does not turn the file's DisableProfiler off.
    let empty = Sources::from_env(|k| (k == "TRAINPROF_DISABLE").then(String::new));
    assert!(!load(&empty.with_config_path(fixture("sdk_disable.json"))).config.enabled);
    let c = with("perhaps");
    assert!(!c.enabled);
    assert_eq!(problem_keys(&c), ["env:TRAINPROF_DISABLE"]);
    // TRAINPROF_DISABLE=0 overrides DisableProfiler, but not a file that cannot be read.
    let on = Sources::from_env(|k| (k == "TRAINPROF_DISABLE").then(|| "0".to_owned()));
    assert!(load(&on.clone().with_config_path(fixture("sdk_disable.json"))).config.enabled);
    assert!(!load(&on.with_config_path(fixture("not_json.json"))).config.enabled);
}

#[test]
fn unreadable_paths() {
    let l = load(&Sources::new().with_config_path(env!("CARGO_MANIFEST_DIR")));
    assert!(
        matches!(l.file, FileStatus::Unusable(ref why) if why.contains("not a regular file")),
        "{:?}",
        l.file
    );
    assert!(!l.config.enabled);

    // A FIFO would block a reader that opened it: refused without opening.
    let dir = Scratch::new("fifo");
    let fifo = dir.0.path().join("profilerconfig.json");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let mut loader = Loader::new(Sources::new().with_config_path(&fifo));
    assert!(matches!(loader.loaded().file, FileStatus::Unusable(_)));
    // The same error again is no change (callers log changes).
    assert_eq!(loader.reload(), Reload::Unchanged);
    std::fs::remove_file(&fifo).unwrap();
    assert_eq!(loader.reload(), Reload::Changed);
    assert_eq!(loader.loaded().file, FileStatus::Missing);
}

#[test]
fn a_fifo_cannot_hang_the_reader_and_a_symlinked_config_is_read() {
    let dir = Scratch::new("fifo-open");
    let fifo = dir.0.path().join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // Read on another thread: a reader that blocks on the FIFO fails the test instead of
    // hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(load(&Sources::new().with_config_path(path)).file);
    });
    let file = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("reading a FIFO hung");
    assert!(matches!(&file, FileStatus::Unusable(why) if why.contains("(a FIFO)")), "{file:?}");

    // ConfigMap-style: ..data -> a timestamped folder, the file -> ..data/file.
    let real = dir.0.path().join("..2026_01_01").join("profilerconfig.json");
    std::fs::create_dir_all(real.parent().unwrap()).unwrap();
    std::fs::write(&real, br#"{"ProfilingIntervalInMilliseconds": 250}"#).unwrap();
    std::os::unix::fs::symlink("..2026_01_01", dir.0.path().join("..data")).unwrap();
    let link = dir.0.path().join("profilerconfig.json");
    std::os::unix::fs::symlink("..data/profilerconfig.json", &link).unwrap();
    let l = load(&Sources::new().with_config_path(&link));
    assert_eq!((l.file, l.config.interval_ms), (FileStatus::Read, 250));
}

#[test]
fn a_file_caught_half_written_at_start_is_read_again_before_it_is_judged() {
    let dir = Scratch::new("settle");
    let path = dir.0.path().join("profilerconfig.json");
    std::fs::write(&path, br#"{"ProfilingIntervalInMilli"#).unwrap();
    let writer = {
        let path = path.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            std::fs::write(&path, br#"{"ProfilingIntervalInMilliseconds": 300}"#).unwrap();
        })
    };
    let loader = Loader::settled(Sources::new().with_config_path(&path), std::time::Duration::from_secs(5));
    writer.join().unwrap();
    assert_eq!(loader.loaded().file, FileStatus::Read);
    assert_eq!(loader.config().interval_ms, 300);
    // One that stays broken is judged after the patience: profiling off, as before.
    std::fs::write(&path, b"{").unwrap();
    let t0 = std::time::Instant::now();
    let loader =
        Loader::settled(Sources::new().with_config_path(&path), std::time::Duration::from_millis(300));
    assert!(t0.elapsed() >= std::time::Duration::from_millis(300));
    assert!(matches!(loader.loaded().file, FileStatus::Unusable(_)));
    assert!(!loader.config().enabled);
}

// ---- no input makes it panic ----------------------------------------------------------

/// Documents built from the real vocabulary in random case, with random values,
/// sub-configs as JSON objects or as (sometimes mangled) Python-literal strings.
fn arb_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        (-3i64..20).prop_map(Value::from),
        "[ -~]{0,12}".prop_map(Value::String),
        prop_oneof![Just("None"), Just("1e3"), Just("inf"), Just("-1"), Just("2.5"), Just(".*"), Just("*")]
            .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::vec((arb_key(), inner), 0..6)
                .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
        ]
    })
}

const VOCABULARY: &[&str] = &[
    "ProfilingParameters",
    "DisableProfiler",
    "S3OutputPath",
    "ProfilingIntervalInMilliseconds",
    "LocalPath",
    "RotateMaxFileSizeInBytes",
    "RotateFileCloseIntervalInSeconds",
    "FileOpenFailThreshold",
    "DetailedProfilingConfig",
    "DataloaderProfilingConfig",
    "PythonProfilingConfig",
    "SMDataParallelProfilingConfig",
    "StartStep",
    "NumSteps",
    "StartTimeInSecSinceEpoch",
    "DurationInSeconds",
    "Duration",
    "MetricsRegex",
    "ProfilerName",
    "cProfileTimer",
];

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        (prop::sample::select(VOCABULARY), any::<u64>()).prop_map(|(k, bits)| {
            k.chars()
                .enumerate()
                .map(
                    |(i, c)| {
                        if bits >> (i % 64) & 1 == 1 {
                            c.to_ascii_uppercase()
                        } else {
                            c.to_ascii_lowercase()
                        }
                    },
                )
                .collect()
        }),
        "[a-zA-Z]{0,8}",
    ]
}

/// A sub-config as text: a serialised random object, optionally cut or with Python
/// spellings swapped in.
fn arb_sub_config_text() -> impl Strategy<Value = String> {
    (arb_value(), any::<u8>(), 0usize..64).prop_map(|(v, mode, cut)| {
        let text = v.to_string();
        match mode % 4 {
            0 => text,
            1 => text.replace('"', "'").replace("true", "True").replace("null", "None").replace('}', ", }"),
            2 => text.chars().take(cut).collect(),
            _ => text.replace(':', " : ").replace(',', ",,"),
        }
    })
}

fn exercise(mut c: Config) {
    for s in [0, 1, 5, 9, 10, 11, u64::MAX - 1, u64::MAX] {
        for now in [0.0, 1_700_000_000.0, f64::MAX] {
            c.detailed.is_active(Step::At(s), now);
            c.dataloader.is_active_for("DataLoaderIter::GetNext", Step::At(s), now);
            c.python.feature.is_active(Step::Any, now);
            c.smdataparallel.is_active(Step::At(s), now);
        }
    }
    let _ = c.problems.iter().map(ToString::to_string).count();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        exercise(from_bytes(&bytes, &Sources::new()));
    }

    #[test]
    fn arbitrary_json_never_panics(v in arb_value()) {
        let c = from_bytes(v.to_string().as_bytes(), &Sources::new());
        if !v.is_object() {
            prop_assert!(!c.enabled);
        }
        exercise(c);
    }

    #[test]
    fn arbitrary_sub_configs_never_panic(
        texts in prop::collection::vec(arb_sub_config_text(), 4),
        scalars in prop::collection::vec(arb_value(), 4),
    ) {
        let doc = serde_json::json!({
            "ProfilingIntervalInMilliseconds": scalars[0],
            "ProfilingParameters": {
                "LocalPath": scalars[1],
                "RotateMaxFileSizeInBytes": scalars[2],
                "FileOpenFailThreshold": scalars[3],
                "DetailedProfilingConfig": texts[0],
                "DataloaderProfilingConfig": texts[1],
                "PythonProfilingConfig": texts[2],
                "SMDataParallelProfilingConfig": texts[3],
            }
        });
        let c = from_bytes(doc.to_string().as_bytes(), &Sources::new());
        prop_assert!(c.enabled);
        exercise(c);
    }

    #[test]
    fn arbitrary_literals_never_panic(text in "\\PC{0,64}") {
        let _ = trainprof_config::literal::parse(&text);
    }
}

/// The framework side (the hook) is configured only by a non-empty `ProfilingParameters`
/// object, as smdebug's `profiling_enabled`.
#[test]
fn framework_configured_only_with_profiling_parameters() {
    let c = |doc: &str| trainprof_config::from_bytes(doc.as_bytes(), &Sources::new());
    assert!(!c("{}").framework_configured);
    assert!(!c(r#"{"ProfilingParameters": {}}"#).framework_configured);
    assert!(!c(r#"{"ProfilingParameters": "x"}"#).framework_configured);
    assert!(!c(r#"{"ProfilingIntervalInMilliseconds": 100}"#).framework_configured);
    assert!(c(r#"{"ProfilingParameters": {"LocalPath": "/x"}}"#).framework_configured);
    assert!(c(r#"{"profilingparameters": {"rotatemaxfilesizeinbytes": 100}}"#).framework_configured);
    assert!(!trainprof_config::Config::defaults().framework_configured);
}
