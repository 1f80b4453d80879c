//! `trainprof config check`: the effective configuration, in words and as JSON.
//!
//! `--steps N` evaluates each feature's window at steps 0..N-1 with the same code the
//! hook uses, from step 0, so what it lists is what a run that counts from 0 will get.
//!
//! Which steps those are depends on the framework, as in smdebug (docs/configuration.md,
//! "`trainprof config check`"): PyTorch tests every window at the global step (every mode counted
//! together), TensorFlow (Keras) the detailed window at the train step and the others at
//! each mode's own step. `--framework` picks one; without it both are said.

use std::fmt::Write as _;

use serde_json::{Value, json};
use trainprof_config::{
    AutoProfiling, CProfileTimer, Config, Feature, FileStatus, Loaded, Off, PythonProfiler, Range, Step,
};
use trainprof_output::UtcTime;

/// The trainer's framework, for the step words (`--framework`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framework {
    PyTorch,
    TensorFlow,
}

impl Framework {
    const ALL: [Framework; 2] = [Framework::PyTorch, Framework::TensorFlow];

    fn name(self) -> &'static str {
        match self {
            Framework::PyTorch => "PyTorch",
            Framework::TensorFlow => "TensorFlow",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Framework::PyTorch => "pytorch",
            Framework::TensorFlow => "tensorflow",
        }
    }
}

/// The features, for the step words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Detailed,
    Dataloader,
    Python,
    Smdataparallel,
    /// trainprof's native sampling: asked at each step boundary with the step the hook
    /// tests windows at (the global step for PyTorch, each mode's own otherwise).
    Native,
    /// PyTorch memory snapshots: the adapter asks at each step begin with its global step.
    Memory,
}

/// Which steps a feature's window counts: smdebug's PyTorch hook tests every window at its
/// global step `hook.step` (the dataloader one at the step a batch is for); its Keras
/// callback tests the detailed window at train batches only, the others at each mode's own
/// step (`mode_steps[mode]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counted {
    Global,
    Train,
    EachMode,
}

impl Counted {
    fn of(fw: Framework, kind: Kind) -> Counted {
        match (fw, kind) {
            (Framework::PyTorch, _) => Counted::Global,
            (Framework::TensorFlow, Kind::Detailed) => Counted::Train,
            (Framework::TensorFlow, _) => Counted::EachMode,
        }
    }

    fn key(self) -> &'static str {
        match self {
            Counted::Global => "global",
            Counted::Train => "train",
            Counted::EachMode => "each_mode",
        }
    }

    /// (plural noun, singular noun, what to add) for a step range: `global steps 5–7
    /// (every mode, PyTorch)`.
    fn words(self, fw: Framework) -> (&'static str, &'static str, String) {
        match self {
            Counted::Global => ("global steps", "global step", format!("every mode, {}", fw.name())),
            Counted::Train => ("train steps", "train step", fw.name().to_owned()),
            Counted::EachMode => ("steps", "step", format!("each mode's own steps, {}", fw.name())),
        }
    }

    /// The same without the framework, for the both-frameworks line.
    fn short(self) -> &'static str {
        match self {
            Counted::Global => "global steps, every mode",
            Counted::Train => "train steps",
            Counted::EachMode => "each mode's own steps",
        }
    }
}

/// What the features do over steps 0..N-1; `None` for a time-based window.
struct StepReport {
    n: u64,
    detailed: Option<Vec<u64>>,
    dataloader: Option<Vec<u64>>,
    python: Option<Vec<u64>>,
    smdataparallel: Option<Vec<u64>>,
    native: Option<Vec<u64>>,
    memory: Option<Vec<u64>>,
}

impl StepReport {
    fn new(config: &Config, n: u64, now_s: f64) -> StepReport {
        StepReport {
            n,
            detailed: active_steps(&config.detailed, n, now_s),
            dataloader: active_steps(&config.dataloader.feature, n, now_s),
            python: active_steps(&config.python.feature, n, now_s),
            smdataparallel: active_steps(&config.smdataparallel, n, now_s),
            native: active_steps(&config.native.feature, n, now_s),
            memory: active_steps(&config.memory.feature, n, now_s),
        }
    }
}

/// Steps among 0..n at which the feature is active, asked in order on a copy of its
/// window; `None` when the window depends on the clock.
fn active_steps(feature: &Feature, n: u64, now_s: f64) -> Option<Vec<u64>> {
    if matches!(feature.window().range(), Range::Time { .. }) && feature.is_enabled() {
        return None;
    }
    let mut f = feature.clone();
    Some((0..n).filter(|&s| f.is_active(Step::At(s), now_s)).collect())
}

/// The check's JSON object (the shape tools rely on; see docs/configuration.md).
pub fn to_json(loaded: &Loaded, steps: Option<u64>, framework: Option<Framework>, now_s: f64) -> Value {
    let c = &loaded.config;
    let report = steps.map(|n| StepReport::new(c, n, now_s));
    let steps_of = |pick: fn(&StepReport) -> &Option<Vec<u64>>| report.as_ref().map(|r| json!(pick(r)));
    let with_steps = |mut obj: Value, active: Option<Value>| {
        if let (Some(a), Some(map)) = (active, obj.as_object_mut()) {
            map.insert("active_steps".into(), a);
        }
        obj
    };
    let counted = |mut obj: Value, kind: Kind| {
        let by_fw: serde_json::Map<String, Value> = Framework::ALL
            .iter()
            .map(|&fw| (fw.key().to_owned(), json!(Counted::of(fw, kind).key())))
            .collect();
        obj["steps_counted"] = Value::Object(by_fw);
        obj
    };
    let mut dataloader = counted(
        with_steps(feature_json(&c.dataloader.feature), steps_of(|r| &r.dataloader)),
        Kind::Dataloader,
    );
    dataloader["metrics_regex"] = json!(c.dataloader.metrics_regex);
    let mut python =
        counted(with_steps(feature_json(&c.python.feature), steps_of(|r| &r.python)), Kind::Python);
    python["profiler"] = json!(c.python.profiler.as_str());
    python["timer"] = json!(c.python.timer.map(CProfileTimer::as_str));
    let mut native =
        counted(with_steps(feature_json(&c.native.feature), steps_of(|r| &r.native)), Kind::Native);
    native["sampling_hz"] = json!(c.native.sampling_hz);
    let mut memory =
        counted(with_steps(feature_json(&c.memory.feature), steps_of(|r| &r.memory)), Kind::Memory);
    memory["max_entries"] = json!(c.memory.max_entries);
    memory["stacks"] = json!(c.memory.stacks.as_str());
    memory["oom_snapshot"] = json!(c.memory.oom_on());
    memory["description"] = json!(memory_words(&c.memory, framework));
    json!({
        "config_path": loaded.path.display().to_string(),
        "config_file": match &loaded.file {
            FileStatus::Read => "read",
            FileStatus::Missing => "missing",
            FileStatus::Unusable(_) => "unusable",
        },
        "enabled": c.enabled,
        "interval_ms": c.interval_ms,
        "local_path": c.local_path,
        "s3_output_path": c.s3_output_path,
        "rotate_max_file_size": c.rotate_max_file_size,
        "rotate_close_interval_s": c.rotate_close_interval_s,
        "file_open_fail_threshold": c.file_open_fail_threshold,
        "framework": framework.map(Framework::key),
        "features": {
            "detailed": counted(with_steps(feature_json(&c.detailed), steps_of(|r| &r.detailed)), Kind::Detailed),
            "dataloader": dataloader,
            "python": python,
            "smdataparallel": counted(
                with_steps(feature_json(&c.smdataparallel), steps_of(|r| &r.smdataparallel)),
                Kind::Smdataparallel,
            ),
            "native": native,
            "memory": memory,
        },
        "auto_profiling": auto_json(&c.auto),
        "hang_detection": hang_json(&c.hang),
        "window_caps": caps_json(&c.caps),
        "problems": c.problems.iter().map(|p| json!({"key": p.key, "message": p.message})).collect::<Vec<_>>(),
    })
}

/// `AutoProfilingConfig` (docs/formats.md, "Anomaly-triggered windows"): the settings as
/// they take effect (defaults filled in), and in words.
fn auto_json(a: &AutoProfiling) -> Value {
    json!({
        "enabled": a.is_enabled(),
        "off_reason": a.off_reason().map(off_reason),
        "step_time_ratio": a.step_time_ratio,
        "warmup_steps": a.warmup_steps,
        "num_steps": a.num_steps,
        "median_of_steps": a.median_of_steps,
        "max_per_hour": a.max_per_hour,
        "features": a.features.iter().map(|f| f.as_str()).collect::<Vec<_>>(),
        "description": auto_words(a),
    })
}

/// `HangDetectionConfig` (docs/formats.md, "Hang and crash dumps"): the settings as read.
fn hang_json(h: &trainprof_config::HangDetection) -> Value {
    json!({
        "enabled": h.is_enabled(),
        "off_reason": h.off_reason().map(off_reason),
        "hang_timeout_s": h.timeout_s,
        "hang_factor": h.factor,
        "description": hang_words(h),
    })
}

/// `WindowCapsConfig` (docs/formats.md, "Window caps"): the caps as they take effect.
fn caps_json(c: &trainprof_config::WindowCaps) -> Value {
    json!({
        "detailed_max_events": c.detailed_max_events,
        "detailed_max_memory_bytes": c.detailed_max_bytes,
        "dataloader_max_events": c.dataloader_max_events,
        "python_max_samples": c.python_max_samples,
        "native_max_samples": c.native_max_samples,
        "description": caps_words(c),
    })
}

/// "detailed 2000000 events or 512 MiB of RSS growth, dataloader ..., python ...".
fn caps_words(c: &trainprof_config::WindowCaps) -> String {
    format!(
        "a window stops early at: detailed {} events or {} MiB of trainer RSS growth; dataloader {} events; \
         python (pyinstrument) {} samples a window; native {} samples a window",
        c.detailed_max_events,
        c.detailed_max_bytes >> 20,
        c.dataloader_max_events,
        c.python_max_samples,
        c.native_max_samples
    )
}

/// "a train step not ended after max(300 s, 10 × the median train step) is a stall: ...".
fn hang_words(h: &trainprof_config::HangDetection) -> String {
    match h.off_reason() {
        Some(Off::NotConfigured) => return "off (not configured)".into(),
        Some(Off::Invalid) => return "off (invalid, see problems)".into(),
        Some(Off::ModelParallel) => return "off (model-parallel training, SM_HPS)".into(),
        Some(Off::ProfilerDisabled) => return "off (profiler disabled)".into(),
        None => {}
    }
    format!(
        "a train step not ended after max({} s, {} × the median train step) is a stall: every thread's stacks go to framework/hangs/; so do a SIGTERM/SIGINT, a crash and an uncaught exception",
        h.timeout_s, h.factor
    )
}

/// "after 20 warm-up train steps, a train step longer than 3 × the median of the last 50
/// train steps outside windows opens detailed, python for the next 2 steps (at most 4 a
/// rolling hour)".
fn auto_words(a: &AutoProfiling) -> String {
    match a.off_reason() {
        Some(Off::NotConfigured) => return "off (not configured)".into(),
        Some(Off::Invalid) => return "off (invalid, see problems)".into(),
        Some(Off::ModelParallel) => return "off (model-parallel training, SM_HPS)".into(),
        Some(Off::ProfilerDisabled) => return "off (profiler disabled)".into(),
        None => {}
    }
    let s = |n: u64, one: &str, many: &str| if n == 1 { format!("1 {one}") } else { format!("{n} {many}") };
    let features: Vec<&str> = a.features.iter().map(|f| f.as_str()).collect();
    format!(
        "after {}, a train step longer than {} × the median of the last {} outside windows opens {} for the next {} (at most {} a rolling hour)",
        s(a.warmup_steps, "warm-up train step", "warm-up train steps"),
        a.step_time_ratio,
        s(a.median_of_steps as u64, "train step", "train steps"),
        features.join(", "),
        s(a.num_steps, "step", "steps"),
        a.max_per_hour,
    )
}

fn feature_json(f: &Feature) -> Value {
    let (start_step, num_steps, start_time_s, duration_s) = match (f.is_enabled(), f.window().range()) {
        (true, Range::Steps { start, num }) => {
            (json!(start), json!(num.unwrap_or(1)), Value::Null, Value::Null)
        }
        (true, Range::Time { start, duration }) => (Value::Null, Value::Null, json!(start), json!(duration)),
        _ => (Value::Null, Value::Null, Value::Null, Value::Null),
    };
    json!({
        "enabled": f.is_enabled(),
        "off_reason": f.off_reason().map(off_reason),
        "start_step": start_step,
        "num_steps": num_steps,
        "start_time_s": start_time_s,
        "duration_s": duration_s,
        "window": describe_window(f, ("steps", "step")),
    })
}

fn off_reason(o: Off) -> &'static str {
    match o {
        Off::NotConfigured => "not_configured",
        Off::Invalid => "invalid",
        Off::ModelParallel => "model_parallel",
        Off::ProfilerDisabled => "profiler_disabled",
    }
}

/// A window in words: "steps 5–5", "from 2026-11-22T10:00:00Z for 30 s", …; `noun` is the
/// plural and singular of what a step is called ("global steps", "global step").
fn describe_window(f: &Feature, noun: (&str, &str)) -> String {
    match f.off_reason() {
        Some(Off::NotConfigured) => return "off (not configured)".into(),
        Some(Off::Invalid) => return "off (invalid, see problems)".into(),
        Some(Off::ModelParallel) => return "off (model-parallel training, SM_HPS)".into(),
        Some(Off::ProfilerDisabled) => return "off (profiler disabled)".into(),
        None => {}
    }
    let (steps, step) = noun;
    let plural = |n: u64| {
        if n == 1 { format!("1 {step}") } else { format!("{n} {steps}") }
    };
    match f.window().range() {
        Range::Never => "on, but never active (no step or time range)".into(),
        Range::Steps { start: Some(s), num } => match num.unwrap_or(1) {
            0 => format!("never (StartStep {s} with NumSteps 0)"),
            n => format!("{steps} {s}–{}", s.saturating_add(n - 1)),
        },
        Range::Steps { start: None, num } => match num.unwrap_or(1) {
            0 => "never (NumSteps 0)".into(),
            n => format!("{} from the first step checked", plural(n)),
        },
        Range::Time { start: Some(t), duration: Some(d) } => format!("from {} for {d} s", utc(t)),
        Range::Time { start: None, duration: Some(d) } => format!("for {d} s from the first step checked"),
        Range::Time { start: Some(t), duration: None } => {
            format!("one step: the first step at or after {}", utc(t))
        }
        Range::Time { start: None, duration: None } => "one step: the first step checked".into(),
    }
}

fn utc(t: f64) -> String {
    #[allow(clippy::cast_possible_truncation)] // a validated, finite time in seconds
    let secs = t.floor() as i64;
    let frac = t - t.floor();
    let base = UtcTime::from_epoch_s(secs).to_string();
    if frac > 0.0 { format!("{} (+{frac:.3} s)", base) } else { base }
}

/// A feature's window in words, with which steps it counts: for `framework`, or for both
/// when it is not given. Only a step range counts steps; other windows read the same.
fn window_words(f: &Feature, kind: Kind, framework: Option<Framework>) -> String {
    let counts_steps =
        f.is_enabled() && matches!(f.window().range(), Range::Steps { num, .. } if num.unwrap_or(1) != 0);
    if !counts_steps {
        return describe_window(f, ("steps", "step"));
    }
    match framework {
        Some(fw) => {
            let (plural, singular, why) = Counted::of(fw, kind).words(fw);
            format!("{} ({why})", describe_window(f, (plural, singular)))
        }
        None => format!(
            "{} ({})",
            describe_window(f, ("steps", "step")),
            Framework::ALL
                .iter()
                .map(|&fw| format!("{}: {}", fw.name(), Counted::of(fw, kind).short()))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

/// `MemoryProfilingConfig` (docs/formats.md, "Memory windows") in words: the window, then
/// what it records and whether an out-of-memory error dumps a snapshot.
fn memory_words(m: &trainprof_config::MemoryFeature, framework: Option<Framework>) -> String {
    if !m.feature.is_enabled() {
        return window_words(&m.feature, Kind::Memory, framework);
    }
    let history =
        format!("PyTorch allocator history of {} entries with {} stacks", m.max_entries, m.stacks.as_str());
    let oom = if m.oom_on() {
        "; history stays on from the first step and a rank's first out-of-memory error dumps a snapshot"
    } else {
        ""
    };
    if matches!(m.feature.window().range(), Range::Never) {
        return format!("no window; {history}{oom}");
    }
    format!(
        "{}, {history}, one snapshot per rank at the window's end{oom}",
        window_words(&m.feature, Kind::Memory, framework)
    )
}

/// The check for people.
pub fn to_text(loaded: &Loaded, steps: Option<u64>, framework: Option<Framework>, now_s: f64) -> String {
    let c = &loaded.config;
    let mut out = String::new();
    let file = match &loaded.file {
        FileStatus::Read => "read".to_owned(),
        FileStatus::Missing => "no such file: built-in defaults".to_owned(),
        FileStatus::Unusable(why) => format!("unusable: {why}"),
    };
    let _ = writeln!(out, "config file: {} ({file})", loaded.path.display());
    let _ = writeln!(out, "profiling: {}", if c.enabled { "on" } else { "off" });
    let _ = writeln!(out, "interval: {} ms", c.interval_ms);
    let _ = writeln!(out, "local path: {}", c.local_path);
    let _ = writeln!(out, "S3 output: {}", c.s3_output_path.as_deref().unwrap_or("none (files stay local)"));
    let _ = writeln!(
        out,
        "timeline files: rotate at {} bytes or every {} s; writer stops after {} failed opens",
        c.rotate_max_file_size, c.rotate_close_interval_s, c.file_open_fail_threshold
    );
    let _ = writeln!(out, "detailed: {}", window_words(&c.detailed, Kind::Detailed, framework));
    let mut dl = window_words(&c.dataloader.feature, Kind::Dataloader, framework);
    if c.dataloader.feature.is_enabled() {
        let _ = write!(dl, ", names matching {:?}", c.dataloader.metrics_regex);
    }
    let _ = writeln!(out, "dataloader: {dl}");
    let mut py = window_words(&c.python.feature, Kind::Python, framework);
    if c.python.feature.is_enabled() {
        py.push_str(match (c.python.profiler, c.python.timer) {
            (PythonProfiler::Pyinstrument, _) => ", pyinstrument",
            (PythonProfiler::CProfile, Some(CProfileTimer::Default)) => ", cProfile, timer by step",
            (PythonProfiler::CProfile, Some(CProfileTimer::CpuTime)) => ", cProfile, cpu_time",
            (PythonProfiler::CProfile, Some(CProfileTimer::OffCpuTime)) => ", cProfile, off_cpu_time",
            (PythonProfiler::CProfile, _) => ", cProfile, total_time",
        });
    }
    let _ = writeln!(out, "python: {py}");
    let _ =
        writeln!(out, "smdataparallel: {}", window_words(&c.smdataparallel, Kind::Smdataparallel, framework));
    let mut native = window_words(&c.native.feature, Kind::Native, framework);
    if c.native.feature.is_enabled() {
        let _ = write!(native, ", sampling the whole process at {} Hz of CPU time", c.native.sampling_hz);
    }
    let _ = writeln!(out, "native: {native}");
    let _ = writeln!(out, "memory: {}", memory_words(&c.memory, framework));
    let _ = writeln!(out, "auto profiling: {}", auto_words(&c.auto));
    let _ = writeln!(out, "hang detection: {}", hang_words(&c.hang));
    let _ = writeln!(out, "window caps: {}", caps_words(&c.caps));
    if let Some(n) = steps {
        let r = StepReport::new(c, n, now_s);
        if r.n == 0 {
            let _ = writeln!(out, "steps: none evaluated (--steps 0)");
        } else {
            let _ = writeln!(out, "steps 0..{} (evaluated from step 0):", r.n - 1);
        }
        let python_timer = |s: u64| match c.python.timer {
            Some(t @ CProfileTimer::Default) => {
                format!(" ({})", t.for_window_start(Step::At(s)).as_str())
            }
            _ => String::new(),
        };
        for (name, active, label) in [
            ("detailed", &r.detailed, None),
            ("dataloader", &r.dataloader, None),
            ("python", &r.python, Some(&python_timer as &dyn Fn(u64) -> String)),
            ("smdataparallel", &r.smdataparallel, None),
            ("native", &r.native, None),
            ("memory", &r.memory, None),
        ] {
            let _ = writeln!(out, "  {name}: {}", list_steps(active.as_deref(), label));
        }
    }
    if c.problems.is_empty() {
        let _ = writeln!(out, "problems: none");
    } else {
        let _ = writeln!(out, "problems ({}):", c.problems.len());
        for p in &c.problems {
            let _ = writeln!(out, "  {p}");
        }
    }
    out
}

/// "0–4, 9" or, with a label per step, "9 (total_time), 10 (cpu_time)".
fn list_steps(active: Option<&[u64]>, label: Option<&dyn Fn(u64) -> String>) -> String {
    let Some(active) = active else {
        return "depends on the clock (time-based window)".into();
    };
    if active.is_empty() {
        return "none".into();
    }
    if let Some(label) = label {
        return active.iter().map(|&s| format!("{s}{}", label(s))).collect::<Vec<_>>().join(", ");
    }
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &s in active {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == s => *end = s,
            _ => runs.push((s, s)),
        }
    }
    runs.iter()
        .map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}–{b}") })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `trainprof config check`: prints the effective configuration of `sources` (as JSON with
/// `json`) on stdout and every problem with what a person typed on stderr, and returns the
/// exit status: 0 when the file was read (1 with `strict` when it has problems), 2 when it
/// is missing or unusable or a typed value is bad.
pub fn main(
    sources: &trainprof_config::Sources,
    json: bool,
    strict: bool,
    steps: Option<u64>,
    framework: Option<Framework>,
) -> std::process::ExitCode {
    use std::io::Write as _;
    use std::process::ExitCode;
    let loaded = trainprof_config::load(sources);
    let now_s =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let text = if json {
        let mut s = to_json(&loaded, steps, framework, now_s).to_string();
        s.push('\n');
        s
    } else {
        // The file's strings (a path, an unknown key, a pattern) reach a terminal: no control
        // character or escape sequence in them acts on it (docs/configuration.md, `trainprof config check`).
        let text = to_text(&loaded, steps, framework, now_s);
        text.lines().map(|l| crate::log::printable(l) + "\n").collect()
    };
    // A closed stdout (`| head`) is not worth a panic.
    let _ = std::io::stdout().write_all(text.as_bytes());
    let bad = typed_problems(sources);
    for line in &bad {
        crate::log!("{line}");
    }
    match &loaded.file {
        FileStatus::Read if !bad.is_empty() => ExitCode::from(2),
        FileStatus::Read if strict && !loaded.config.problems.is_empty() => ExitCode::from(1),
        FileStatus::Read => ExitCode::SUCCESS,
        FileStatus::Missing => {
            crate::log!("no config file at {}", loaded.path.display());
            ExitCode::from(2)
        }
        FileStatus::Unusable(why) => {
            crate::log!("{why}");
            ExitCode::from(2)
        }
    }
}

/// The values a person typed (flags, `TRAINPROF_*` variables) that are not valid, one line
/// each, named as typed: `--interval-ms: "50" is outside 100..=60000 ms`.
pub fn typed_problems(sources: &trainprof_config::Sources) -> Vec<String> {
    trainprof_config::override_problems(sources)
        .into_iter()
        .map(|p| {
            let name = p.key.strip_prefix("flag:").or_else(|| p.key.strip_prefix("env:")).unwrap_or(&p.key);
            format!("{name}: {}", p.message)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_lists() {
        assert_eq!(list_steps(Some(&[0, 1, 2, 5, 7, 8]), None), "0–2, 5, 7–8");
        assert_eq!(list_steps(Some(&[]), None), "none");
        assert_eq!(list_steps(None, None), "depends on the clock (time-based window)");
        let l = |s: u64| format!(" (s{s})");
        assert_eq!(list_steps(Some(&[9, 10]), Some(&l)), "9 (s9), 10 (s10)");
    }

    fn loaded(doc: &str) -> Loaded {
        Loaded {
            path: "profilerconfig.json".into(),
            file: FileStatus::Read,
            config: trainprof_config::from_bytes(doc.as_bytes(), &trainprof_config::Sources::default()),
        }
    }

    #[test]
    fn native_in_words_and_json() {
        let l = loaded(
            r#"{"ProfilingParameters": {"NativeProfilingConfig": "{\"StartStep\": 4, \"NumSteps\": 2, \"SamplingHz\": 250}"}}"#,
        );
        let text = to_text(&l, Some(8), Some(Framework::PyTorch), 0.0);
        assert!(
            text.lines().any(|line| line
                == "native: global steps 4–5 (every mode, PyTorch), sampling the whole process at 250 Hz of CPU time"),
            "{text}"
        );
        assert!(text.lines().any(|line| line == "  native: 4–5"), "{text}");
        let v = to_json(&l, Some(8), None, 0.0);
        let n = &v["features"]["native"];
        assert_eq!(n["enabled"], true);
        assert_eq!(n["sampling_hz"], 250);
        assert_eq!(n["active_steps"], json!([4, 5]));
        assert_eq!(n["steps_counted"]["tensorflow"], "each_mode");

        let l = loaded(
            r#"{"ProfilingParameters": {"NativeProfilingConfig": "{\"StartStep\": 4, \"SamplingHz\": 0}"}}"#,
        );
        let text = to_text(&l, None, None, 0.0);
        assert!(text.lines().any(|line| line == "native: off (invalid, see problems)"), "{text}");
        assert!(
            text.contains("ProfilingParameters.NativeProfilingConfig.SamplingHz: 0 is outside 1..=1000 Hz; this feature is off"),
            "{text}"
        );
        let text = to_text(&loaded(r#"{"ProfilingParameters": {"LocalPath": "/x"}}"#), None, None, 0.0);
        assert!(text.lines().any(|line| line == "native: off (not configured)"), "{text}");
    }

    #[test]
    fn memory_in_words_and_json() {
        let l = loaded(
            r#"{"ProfilingParameters": {"MemoryProfilingConfig": "{\"StartStep\": 4, \"NumSteps\": 2, \"MaxEntries\": 5000, \"Stacks\": \"all\"}"}}"#,
        );
        let text = to_text(&l, Some(8), Some(Framework::PyTorch), 0.0);
        assert!(
            text.lines().any(|line| line
                == "memory: global steps 4–5 (every mode, PyTorch), PyTorch allocator history of 5000 entries with all stacks, one snapshot per rank at the window's end"),
            "{text}"
        );
        assert!(text.lines().any(|line| line == "  memory: 4–5"), "{text}");
        let v = to_json(&l, Some(8), None, 0.0);
        let m = &v["features"]["memory"];
        assert_eq!(
            (&m["enabled"], &m["max_entries"], &m["stacks"]),
            (&json!(true), &json!(5000), &json!("all"))
        );
        assert_eq!((&m["active_steps"], &m["oom_snapshot"]), (&json!([4, 5]), &json!(false)));

        let l = loaded(r#"{"ProfilingParameters": {"MemoryProfilingConfig": {"OomSnapshot": true}}}"#);
        let text = to_text(&l, None, None, 0.0);
        assert!(
            text.lines().any(|line| line
                == "memory: no window; PyTorch allocator history of 100000 entries with python stacks; history stays on from the first step and a rank's first out-of-memory error dumps a snapshot"),
            "{text}"
        );
        assert!(text.contains("problems: none"), "{text}");
        let l = loaded(r#"{"ProfilingParameters": {"MemoryProfilingConfig": {"Stacks": "cpp"}}}"#);
        let text = to_text(&l, None, None, 0.0);
        assert!(text.lines().any(|line| line == "memory: off (invalid, see problems)"), "{text}");
        let text = to_text(&loaded(r#"{"ProfilingParameters": {"LocalPath": "/x"}}"#), None, None, 0.0);
        assert!(text.lines().any(|line| line == "memory: off (not configured)"), "{text}");
    }

    #[test]
    fn auto_profiling_in_words() {
        let config = |auto: &str| {
            let doc = format!(r#"{{"ProfilingParameters": {{"AutoProfilingConfig": {auto}}}}}"#);
            trainprof_config::from_bytes(doc.as_bytes(), &trainprof_config::Sources::new()).auto
        };
        assert_eq!(
            auto_words(&config(
                r#""{\"StepTimeRatio\": 3, \"WarmupSteps\": 20, \"NumSteps\": 2, \"Features\": [\"detailed\", \"python\"], \"MaxPerHour\": 4}""#
            )),
            "after 20 warm-up train steps, a train step longer than 3 × the median of the last 50 train steps \
             outside windows opens detailed, python for the next 2 steps (at most 4 a rolling hour)"
        );
        assert_eq!(
            auto_words(&config(
                r#"{"StepTimeRatio": 2.5, "WarmupSteps": 1, "NumSteps": 1, "Features": ["native"]}"#
            )),
            "after 1 warm-up train step, a train step longer than 2.5 × the median of the last 50 train steps \
             outside windows opens native for the next 1 step (at most 4 a rolling hour)"
        );
        assert_eq!(auto_words(&config(r#"{"NumSteps": 0}"#)), "off (invalid, see problems)");
        assert_eq!(auto_words(&config("null")), "off (not configured)");
        let v = auto_json(&config(r#"{"MedianOfSteps": 9}"#));
        assert_eq!(v["median_of_steps"], 9);
        assert_eq!(v["features"], json!(["detailed", "python"]));
        assert_eq!(v["off_reason"], Value::Null);
    }

    #[test]
    fn hang_detection_in_words_and_json() {
        let config = |hang: &str| {
            let doc = format!(r#"{{"ProfilingParameters": {{"HangDetectionConfig": {hang}}}}}"#);
            trainprof_config::from_bytes(doc.as_bytes(), &trainprof_config::Sources::new()).hang
        };
        assert_eq!(
            hang_words(&config(r#""{\"HangTimeoutS\": 300, \"HangFactor\": 10}""#)),
            "a train step not ended after max(300 s, 10 × the median train step) is a stall: every thread's \
             stacks go to framework/hangs/; so do a SIGTERM/SIGINT, a crash and an uncaught exception"
        );
        assert_eq!(hang_words(&config(r#"{"HangTimeoutS": 0}"#)), "off (invalid, see problems)");
        assert_eq!(hang_words(&config("null")), "off (not configured)");
        let v = hang_json(&config(r#"{"HangTimeoutS": 1.5}"#));
        assert_eq!(
            (v["enabled"].clone(), v["hang_timeout_s"].clone(), v["hang_factor"].clone()),
            (json!(true), json!(1.5), json!(10.0))
        );
        assert_eq!(v["off_reason"], Value::Null);
    }

    #[test]
    fn window_caps_in_words_and_json() {
        let doc = r#"{"ProfilingParameters": {"WindowCapsConfig": {"DetailedMaxEvents": 10, "DetailedMaxMemoryMiB": 0}}}"#;
        let c = trainprof_config::from_bytes(doc.as_bytes(), &trainprof_config::Sources::new());
        assert_eq!(
            caps_words(&c.caps),
            "a window stops early at: detailed 10 events or 512 MiB of trainer RSS growth; dataloader 100000 events; \
             python (pyinstrument) 1000000 samples a window; native 1000000 samples a window"
        );
        let v = caps_json(&c.caps);
        assert_eq!(
            (v["detailed_max_events"].clone(), v["detailed_max_memory_bytes"].clone()),
            (json!(10), json!(512 << 20))
        );
        assert_eq!(v["native_max_samples"], json!(1_000_000));
        assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
    }
}
