//! The C ABI from the outside: the committed header is what cbindgen makes, and C
//! programs compiled with `cc` against it run against the built library.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::HashMap;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn header_matches_cbindgen() {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("cbindgen")
        .write(&mut generated);
    let path = dir.join("include/trainprof_hook.h");
    if std::env::var_os("TRAINPROF_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date: run `TRAINPROF_BLESS=1 cargo test -p trainprof-hook --test abi header`",
        path.display()
    );
}

// ---- C programs against the built library ------------------------------------------------
//
// Each scenario is its own process (one hook per process): a C program in tests/c is
// compiled with the system C compiler (`cc`, or `$CC`) against the committed header and
// the cdylib that cargo builds next to this test binary, run with a config in a fresh
// temporary directory, and what it prints and the timeline files it leaves are checked
// here.

/// The directory of `libtrainprof_hook.so`: this test binary is
/// `target/<profile>/deps/abi-<hash>`, and `cargo test` builds the cdylib (the library
/// target of this package) into `deps`. The copy in `target/<profile>` is only refreshed by
/// `cargo build`, so it can be older than the code under test: `deps` comes first.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().expect("the test binary lives in target/<profile>/deps");
    let profile = deps.parent().expect("the test binary lives in target/<profile>/deps");
    for dir in [deps, profile] {
        if dir.join("libtrainprof_hook.so").is_file() {
            return dir.to_path_buf();
        }
    }
    panic!(
        "libtrainprof_hook.so is in neither {} nor {}: it is built by `cargo build -p trainprof-hook` \
         (and by `cargo test -p trainprof-hook`)",
        profile.display(),
        deps.display()
    );
}

/// A fresh directory under the system's temporary directory (tempfile), removed when dropped,
/// also when a test fails (kept when `TRAINPROF_KEEP_TEST_DIRS` is set, for a look after a
/// failure).
struct TempDir(tempfile::TempDir);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let mut dir = tempfile::Builder::new().prefix(&format!("trainprof-abi-{tag}-")).tempdir().unwrap();
        if std::env::var_os("TRAINPROF_KEEP_TEST_DIRS").is_some() {
            dir.disable_cleanup(true);
            eprintln!("keeping {}", dir.path().display());
        }
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

/// Compiles `tests/c/<name>.c` into `dir` and returns the program's path.
fn compile_c(name: &str, dir: &Path) -> PathBuf {
    let cc = std::env::var_os("CC").filter(|c| !c.is_empty()).unwrap_or_else(|| "cc".into());
    let lib = lib_dir();
    let src = crate_dir().join("tests/c").join(format!("{name}.c"));
    let exe = dir.join(name);
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir().join("include"))
        .arg(&src)
        .arg("-L")
        .arg(&lib)
        .arg("-ltrainprof_hook")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lpthread")
        .arg("-o")
        .arg(&exe);
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "the C ABI tests need a C compiler, and `{}` was not found ({e}): install one \
             (e.g. `apt-get install gcc`) or set CC to one",
            cc.to_string_lossy()
        ),
        Err(e) => panic!("cannot run the C compiler `{}`: {e}", cc.to_string_lossy()),
    };
    assert!(
        out.status.success(),
        "compiling {} failed ({}):\n{}{}",
        src.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Writes the profiler config for a run into `dir` and returns its path.
fn write_config(dir: &Path, params: Value) -> PathBuf {
    let path = dir.join("profilerconfig.json");
    let config = json!({ "ProfilingParameters": params });
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    path
}

/// What a C program did: its exit status, pid and output.
struct Run {
    status: ExitStatus,
    pid: u32,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Run {
    /// The values of `key=` lines on stdout, in order.
    fn all(&self, key: &str) -> Vec<&str> {
        self.stdout.lines().filter_map(|l| l.strip_prefix(key)?.strip_prefix('=')).collect()
    }

    /// The value of the one `key=` line.
    fn get(&self, key: &str) -> &str {
        let all = self.all(key);
        assert!(all.len() == 1, "expected one `{key}=` line, got {}:\n{}", all.len(), self.report());
        all[0]
    }

    fn num(&self, key: &str) -> u64 {
        let v = self.get(key);
        v.parse().unwrap_or_else(|e| panic!("`{key}={v}` is not a count ({e}):\n{}", self.report()))
    }

    fn report(&self) -> String {
        format!("status {}\n--- stdout\n{}--- stderr\n{}", self.status, self.stdout, self.stderr)
    }

    fn assert_success(&self) {
        assert!(self.status.success(), "the C program failed:\n{}", self.report());
    }
}

/// Runs `exe` with `args`, the config `config` and `envs`, killing it after `limit`.
/// Its output goes to files, so that nothing blocks on a full pipe.
fn run_c(exe: &Path, args: &[&str], config: &Path, envs: &[(&str, &str)], limit: Duration) -> Run {
    let dir = exe.parent().unwrap();
    let name = exe.file_name().unwrap().to_string_lossy().into_owned();
    let (out_path, err_path) = (dir.join(format!("{name}.stdout")), dir.join(format!("{name}.stderr")));
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    // Only the settings given here: nothing from the environment the tests run in.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        // cargo sets LD_LIBRARY_PATH, which wins over the program's RUNPATH and may name a
        // stale copy of the library (target/<profile>/ is only refreshed by `cargo build`).
        if k.starts_with("TRAINPROF_")
            || k.starts_with("SMPROFILER_")
            || k == "SM_HPS"
            || k == "LD_LIBRARY_PATH"
        {
            cmd.env_remove(&*k);
        }
    }
    cmd.env("SMPROFILER_CONFIG_PATH", config);
    cmd.envs(envs.iter().copied());
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    let pid = child.id();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} did not finish within {limit:?} (a deadlock?)\n--- stdout\n{}--- stderr\n{}",
                exe.display(),
                std::fs::read_to_string(&out_path).unwrap_or_default(),
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = start.elapsed();
    let stdout = String::from_utf8_lossy(&std::fs::read(&out_path).unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&std::fs::read(&err_path).unwrap()).into_owned();
    Run { status, pid, stdout, stderr, elapsed }
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() { todo.push(p) } else { out.push(p) }
        }
    }
    out.sort();
    out
}

/// The sealed timeline files under `local` (`framework/pevents/<hour>/<T>_<node>_...`), in
/// the order they were written (names strictly increase), after checking that no
/// temporary file was left behind and that every name ends in `_<node>_pythontimeline.json`.
fn sealed_files(local: &Path, node: Option<&str>) -> Vec<PathBuf> {
    let all = files_under(&local.join("framework"));
    let tmp: Vec<_> = all.iter().filter(|p| p.to_string_lossy().ends_with(".tmp")).collect();
    assert!(tmp.is_empty(), "temporary files left behind: {tmp:?}");
    let pevents = local.join("framework/pevents");
    let cost = local.join(trainprof_output::protocol::hook_cost::FOLDER);
    let mut sealed: Vec<(i64, PathBuf)> = Vec::new();
    for p in all {
        // The hook's own cost record (docs/formats.md, "The hook's own cost"): `<node>/<µs>.json`.
        if let Ok(rel) = p.strip_prefix(&cost) {
            let r = trainprof_output::protocol::hook_cost::parse(&std::fs::read(&p).unwrap()).unwrap();
            assert_eq!(rel.iter().count(), 2, "{}", p.display());
            if let Some(node) = node {
                assert_eq!(r.node, node);
            }
            continue;
        }
        let rel = p.strip_prefix(&pevents).unwrap_or_else(|_| panic!("an unexpected file {}", p.display()));
        let parts: Vec<_> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        assert!(
            parts.len() == 2 && parts[0].len() == 10 && parts[0].bytes().all(|b| b.is_ascii_digit()),
            "not pevents/<YYYYMMDDHH>/<file>: {}",
            p.display()
        );
        let name = &parts[1];
        assert!(name.ends_with("_pythontimeline.json"), "{name}");
        if let Some(node) = node {
            assert!(
                name.ends_with(&format!("_{node}_pythontimeline.json")),
                "{name} does not name node {node}"
            );
        }
        let t: i64 =
            name.split('_').next().unwrap().parse().unwrap_or_else(|_| panic!("{name}: no end time"));
        sealed.push((t, p));
    }
    sealed.sort();
    assert!(sealed.windows(2).all(|w| w[0].0 < w[1].0), "file names do not strictly increase: {sealed:?}");
    sealed.into_iter().map(|(_, p)| p).collect()
}

/// The events of one sealed file, after checking that it is a bare JSON array with one
/// event a line.
fn file_events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.starts_with("[\n") && text.ends_with("\n]"), "{} is not sealed", path.display());
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()));
    let events = v.as_array().unwrap_or_else(|| panic!("{} is not a JSON array", path.display())).clone();
    assert_eq!(events.len(), text.lines().count() - 2, "{}: one event a line", path.display());
    events
}

/// The complete (`X`) events of all sealed files, in the order they were written.
fn x_events(files: &[PathBuf]) -> Vec<Value> {
    files.iter().flat_map(|f| file_events(f)).filter(|e| e["ph"] == "X").collect()
}

fn step_num(e: &Value) -> Option<&str> {
    e["args"].get("step_num").map(|s| s.as_str().unwrap_or_else(|| panic!("step_num is not a string: {e}")))
}

#[test]
fn c_api_end_to_end() {
    let tmp = TempDir::new("api");
    let local = tmp.path().join("out");
    let exe = compile_c("api", tmp.path());
    let config = write_config(
        tmp.path(),
        json!({
            "LocalPath": local,
            "RotateMaxFileSizeInBytes": 100_000,
            "DetailedProfilingConfig": "{\"StartStep\": 5, \"NumSteps\": 2}",
            "DataloaderProfilingConfig": "{\"StartStep\": 0, \"NumSteps\": 1, \"MetricsRegex\": \"Data.*\"}",
        }),
    );
    let run = run_c(&exe, &[local.to_str().unwrap()], &config, &[], Duration::from_secs(120));
    run.assert_success();
    assert_eq!(run.get("version"), env!("CARGO_PKG_VERSION"));
    assert_eq!(run.get("failures"), "0");
    let recorded = run.num("recorded");
    assert_eq!(run.num("written"), recorded);

    let node = run.get("node");
    let files = sealed_files(&local, Some(node));
    // The hook's own cost (docs/formats.md, "The hook's own cost"): a C caller's calls, timed
    // inside the library; the bytes are those of the sealed timelines.
    {
        use trainprof_output::protocol::hook_cost::{self, Part};
        let cost = files_under(&local.join(hook_cost::FOLDER));
        assert_eq!(cost.len(), 1, "{cost:?}");
        let r = hook_cost::parse(&std::fs::read(&cost[0]).unwrap()).unwrap();
        let bytes: u64 = files.iter().map(|f| f.metadata().unwrap().len()).sum();
        assert_eq!(r.bytes_written, bytes, "{r:?}");
        assert!(r.steps > 0 && r.events_written > 0, "{r:?}");
        assert!(r.part(Part::AbiStep).is_some_and(|p| p.calls >= r.steps && p.seconds > 0.0), "{r:?}");
        assert!(r.part(Part::AbiRecord).is_some_and(|p| p.calls > 0), "{r:?}");
        assert!(r.parts.iter().all(|p| p.part.starts_with("abi.")), "{r:?}");
    }
    assert_eq!(files.len() as u64, run.num("files_sealed"));
    let events = x_events(&files);
    assert_eq!(events.len() as u64, recorded, "{events:#?}");
    for e in &events {
        assert_eq!(e["args"]["pid"], run.pid, "{e}");
    }
    let named = |name: &str| events.iter().filter(|e| e["name"] == name).collect::<Vec<_>>();

    let with_args = named("WithArgs");
    assert_eq!(with_args.len(), 1);
    let a = &with_args[0]["args"];
    assert_eq!(a["worker_id"], -7, "{a}");
    assert_eq!(a["ratio"].as_f64(), Some(0.25), "{a}");
    assert_eq!(a["pin_memory"], true, "{a}");
    assert_eq!(a["step_num"], "42", "{a}");
    assert_eq!(with_args[0]["dur"], 10);

    // Recorded before any step (no step_num), at step 43, in train steps 0..=2, in eval
    // steps 0 and 1.
    let net: Vec<_> = named("Net").iter().map(|e| step_num(e)).collect();
    assert_eq!(net, [None, Some("43"), Some("0"), Some("1"), Some("2"), Some("0"), Some("1")]);
    let steps = |name: &str| named(name).iter().map(|e| step_num(e).unwrap().to_owned()).collect::<Vec<_>>();
    // Train step 10 was begun again as 11 before it ended: only 11 and 12 end.
    assert_eq!(steps("Step:ModeKeys.TRAIN"), ["0", "1", "2", "11", "12"]);
    assert_eq!(steps("Step:ModeKeys.EVAL"), ["0", "1"]);
    // Recorded after the caught panic, in the current step.
    assert_eq!(steps("AfterPanic"), ["12"]);
    // The torch trace's ops, numbered by the step they began in (docs/formats.md, "Detailed
    // windows through torch's own trace"); its files are gone.
    let mm = named("aten::mm");
    assert_eq!(mm.len(), 1, "{mm:#?}");
    assert_eq!(mm[0]["args"]["tid"], 9);
    assert_eq!(mm[0]["dur"], 3);
    assert_eq!(steps("aten::mm"), ["5"]);
    assert_eq!(steps("aten::relu"), ["6"]);
    assert!(named("aten::is_leaf").is_empty());
    let traces: Vec<_> = std::fs::read_dir(local.join(".trainprof-torch")).unwrap().collect();
    assert!(traces.is_empty(), "{traces:?}");
    for e in named("Step:ModeKeys.EVAL").iter().chain(&named("Step:ModeKeys.TRAIN")) {
        assert!(e["dur"].as_i64().unwrap() >= 0, "{e}");
    }
}

#[test]
fn c_fork_children_are_inert() {
    const CHILDREN: usize = 4;
    let tmp = TempDir::new("fork");
    let local = tmp.path().join("out");
    let exe = compile_c("fork", tmp.path());
    let config = write_config(tmp.path(), json!({ "LocalPath": local, "RotateMaxFileSizeInBytes": 200_000 }));
    let run = run_c(&exe, &[&CHILDREN.to_string(), "300"], &config, &[], Duration::from_secs(180));
    run.assert_success();

    let parent: u32 = run.get("parent").parse().unwrap();
    assert_eq!(parent, run.pid);
    let children = run.all("child");
    assert_eq!(children.len(), CHILDREN, "{}", run.report());
    let exits = run.all("child_exit");
    assert_eq!(exits.len(), CHILDREN, "a child did not exit normally:\n{}", run.report());
    for e in &exits {
        assert!(e.ends_with(":0"), "child {e}:\n{}", run.report());
    }
    assert_eq!(run.get("children_failed"), "0");
    assert_eq!(run.get("parent_errors"), "0");
    let mut forked: Vec<u64> = children.iter().map(|c| c.parse().unwrap()).collect();
    forked.push(run.get("grandchild").parse().unwrap());

    let accepted = run.num("accepted");
    assert_eq!(run.num("stats_written"), accepted, "{}", run.report());
    assert_eq!(run.num("stats_dropped_queue_full"), run.num("dropped"), "{}", run.report());
    assert_eq!(run.num("stats_dropped_writer"), 0);

    let files = sealed_files(&local, None);
    assert!(!files.is_empty());
    let mut x = 0u64;
    for f in &files {
        for e in file_events(f) {
            if let Some(pid) = e["args"].get("pid") {
                let pid = pid.as_u64().unwrap();
                assert!(!forked.contains(&pid), "an event of forked child {pid} in {}: {e}", f.display());
                assert_eq!(pid, u64::from(parent), "{e}");
            }
            if e["ph"] == "X" {
                x += 1;
            }
        }
    }
    assert_eq!(x, accepted, "the parent's files hold every event it recorded, and nothing else");
    eprintln!(
        "fork: {accepted} events accepted, {} dropped, {} files, {:.2}s",
        run.num("dropped"),
        files.len(),
        run.elapsed.as_secs_f64()
    );
}

#[test]
fn c_threads_count_every_event() {
    const THREADS: u64 = 8;
    const CALLS: u64 = 1_000_000;
    let tmp = TempDir::new("threads");
    let local = tmp.path().join("out");
    let exe = compile_c("threads", tmp.path());
    let config =
        write_config(tmp.path(), json!({ "LocalPath": local, "RotateMaxFileSizeInBytes": 4_000_000 }));
    let run = run_c(
        &exe,
        &[&THREADS.to_string(), &CALLS.to_string()],
        &config,
        &[("TRAINPROF_QUEUE_EVENTS", "4096")],
        Duration::from_secs(600),
    );
    run.assert_success();
    let (ok, dropped) = (run.num("ok"), run.num("dropped"));
    assert_eq!(run.num("other"), 0);
    assert_eq!(ok + dropped, THREADS * CALLS, "{}", run.report());
    assert_eq!(run.get("shutdown"), "0", "shutdown did not return OK");
    assert_eq!(run.get("stats"), "0");
    assert_eq!(run.num("stats_dropped_queue_full"), dropped, "{}", run.report());
    assert_eq!(run.num("stats_written"), ok, "{}", run.report());
    assert_eq!(run.num("stats_dropped_writer"), 0);
    assert_eq!(run.num("dropped_events"), dropped);
    // The queue holds 4096 events, and the writer started with an empty one.
    assert!(ok >= 4096, "{}", run.report());

    // Count the X events of each thread (named T<i>) line by line: there may be many.
    let files = sealed_files(&local, None);
    assert_eq!(files.len() as u64, run.num("stats_files_sealed"));
    let mut per_thread: HashMap<String, u64> = HashMap::new();
    let mut bytes = 0;
    for f in &files {
        bytes += std::fs::metadata(f).unwrap().len();
        let mut lines = std::io::BufReader::new(std::fs::File::open(f).unwrap()).lines();
        assert_eq!(lines.next().unwrap().unwrap(), "[", "{}", f.display());
        let mut last = String::new();
        for line in lines {
            let line = line.unwrap();
            if line.contains("\"ph\": \"X\"") {
                let name = line
                    .strip_prefix("{\"name\": \"")
                    .and_then(|r| r.split('"').next())
                    .unwrap_or_else(|| panic!("{}: {line}", f.display()));
                *per_thread.entry(name.to_owned()).or_default() += 1;
            }
            last = line;
        }
        assert_eq!(last, "]", "{} is not sealed", f.display());
    }
    let mut in_files = 0;
    for t in run.all("thread_ok") {
        let (name, n) = t.split_once(':').unwrap();
        let n: u64 = n.parse().unwrap();
        assert_eq!(per_thread.remove(name).unwrap_or(0), n, "events of {name}");
        in_files += n;
    }
    assert!(per_thread.is_empty(), "events of unknown threads: {per_thread:?}");
    assert_eq!(in_files, ok);
    eprintln!(
        "threads: {THREADS} x {CALLS} calls in {}s: {ok} accepted and written ({:.1} MB in {} files), {dropped} dropped; \
         {} written before shutdown, shutdown took {}s, whole run {:.2}s",
        run.get("record_seconds"),
        bytes as f64 / 1e6,
        files.len(),
        run.get("written_before_shutdown"),
        run.get("shutdown_seconds"),
        run.elapsed.as_secs_f64()
    );
}
