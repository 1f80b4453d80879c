//! `trainprof agent` and `trainprof run`: configuration, signals, the child, the loop.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use trainprof_agent::launch::{self, SelfCost};
use trainprof_agent::sample::{Roots, gpu, process::self_usage};
use trainprof_agent::system::{SystemWriter, algo_index};
use trainprof_agent::tick::{Clock as _, Stop, SystemClock, Ticker};
use trainprof_agent::{log, signals};
use trainprof_config::{DEFAULT_LOCAL_PATH, FileStatus, Sources};

use crate::AgentFlags;

/// Where SageMaker writes the resource config (`TRAINPROF_RESOURCE_CONFIG` overrides it).
const DEFAULT_RESOURCE_CONFIG: &str = "/opt/ml/input/config/resourceconfig.json";

pub fn main(flags: AgentFlags, command: Option<Vec<OsString>>) -> ExitCode {
    // Before any thread exists, so that every thread inherits the mask.
    if let Err(e) = signals::block() {
        log!("cannot block SIGTERM/SIGINT ({e}); they will end trainprof at once");
    }
    let explicit_local_path = flags.overrides.local_path.clone();
    let config_flag = flags.config.clone();
    let mut sources = Sources::from_process_env();
    if let Some(p) = &flags.config {
        sources = sources.with_config_path(p);
    }
    let loaded = trainprof_config::load(&flags.overrides.apply(sources));
    match &loaded.file {
        FileStatus::Read => log!("config {}", loaded.path.display()),
        FileStatus::Missing => log!("no config at {}: built-in defaults", loaded.path.display()),
        FileStatus::Unusable(why) => log!("config {} unusable: {why}", loaded.path.display()),
    }
    for p in &loaded.config.problems {
        log!("config: {p}");
    }
    let config = loaded.config;
    if let Some(s3) = &config.s3_output_path {
        let endpoint = flags.s3_endpoint.as_deref().map(|e| format!(" via {e}")).unwrap_or_default();
        log!("S3 upload to {s3}{endpoint} is not in this build yet: files stay under the output folder");
    }

    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let root = if config.enabled {
        let explicit = config.local_path != DEFAULT_LOCAL_PATH;
        match launch::output_root(config.local_path(), explicit, &cwd) {
            Ok((root, note)) => {
                if let Some(n) = note {
                    log!("{n}");
                }
                Some(root)
            }
            Err(e) => {
                log!("{e}");
                if command.is_none() {
                    return ExitCode::from(2);
                }
                log!("running the command without profiling");
                None
            }
        }
    } else {
        log!("profiling is off (DisableProfiler, TRAINPROF_DISABLE or --disable)");
        None
    };

    let stop = Stop::new();
    let clock = SystemClock::new(stop.clone());
    let started = Instant::now();

    // The child first: the trainer must start even if sampling cannot.
    let child = match &command {
        None => None,
        Some(argv) => {
            let fell_back = root.as_ref().is_some_and(|r| r != config.local_path());
            let local_path_env = if explicit_local_path.is_some() || fell_back { root.clone() } else { None };
            match spawn(argv, config_flag.as_ref(), local_path_env.as_ref()) {
                Ok(c) => Some(c),
                Err((code, e)) => {
                    log!("cannot run {}: {e}", argv[0].to_string_lossy());
                    return ExitCode::from(code);
                }
            }
        }
    };
    let child_pid = child.as_ref().map(std::process::Child::id);
    let status: Arc<Mutex<Option<ExitStatus>>> = Arc::new(Mutex::new(None));
    let waiter = child.map(|mut c| {
        let (status, stop) = (Arc::clone(&status), stop.clone());
        std::thread::spawn(move || {
            let st = c.wait().ok();
            *status.lock().unwrap_or_else(PoisonError::into_inner) = st;
            stop.request();
        })
    });
    let signal_stop = stop.clone();
    let spawned = signals::spawn(move |sig| match child_pid {
        // Ctrl-C in a terminal already reached the trainer (same process group).
        Some(pid) if sig.from_process => {
            log!("{} passed on to {pid}", sig.name());
            if let Err(e) = signals::send(pid, sig.signo) {
                log!("cannot pass {} on to {pid}: {e}", sig.name());
            }
        }
        Some(_) => {}
        None => {
            log!("{}: sealing files and stopping", sig.name());
            signal_stop.request();
        }
    });
    if let Err(e) = spawned {
        log!("cannot start the signal thread: {e}");
    }

    let mut counts = None;
    if let Some(root) = &root {
        let roots = Roots::host();
        let now = clock.mono();
        let probed = launch::probe_samplers(&roots, now, child_pid, gpu::lib_from_env().as_deref());
        let algo_n = algo_index(read_resource_config().as_ref(), |k| std::env::var(k).ok());
        let interval = Duration::from_millis(u64::from(config.interval_ms));
        let mut ticker = Ticker::new(probed.samplers, SystemWriter::new(root, algo_n), interval);
        log!(
            "sampling every {} ms into {} as algo-{algo_n}: {} ({} cores, {} GPUs)",
            config.interval_ms,
            root.join("system").display(),
            ticker.sampler_names().join(", "),
            probed.cores,
            probed.gpus
        );
        if !probed.absent.is_empty() {
            log!("not sampled: {}", probed.absent.join("; "));
        }
        let cpu_before = self_usage().0;
        ticker.run(&clock);
        let mut c = ticker.counts();
        c.sampling_cpu_us = self_usage().0.saturating_sub(cpu_before);
        counts = Some(c);
    } else {
        // Nothing to sample: wait for the child (or a signal) all the same.
        clock.wait_until(Duration::MAX);
    }

    if let Some(w) = waiter {
        let _ = w.join();
    }
    if let (Some(root), Some(counts)) = (&root, &counts) {
        if let Err(e) = launch::write_end_markers(root, clock.wall_s()) {
            log!("cannot write the training_job_end.ts markers: {e}");
        }
        let (cpu_us, rss_bytes) = self_usage();
        let cost = SelfCost { cpu_us, rss_bytes, wall_s: started.elapsed().as_secs_f64() };
        for line in launch::summary(root, launch::count_outputs(root), counts, cost).lines() {
            log!("{line}");
        }
    }
    let status = *status.lock().unwrap_or_else(PoisonError::into_inner);
    match (command.is_some(), status) {
        (false, _) => ExitCode::SUCCESS,
        (true, Some(st)) => ExitCode::from(exit_code(st)),
        (true, None) => {
            log!("lost track of the command's exit status");
            ExitCode::from(1)
        }
    }
}

/// Starts the command with what the Python package needs in its environment. The error
/// carries the shell's exit code for it: 127 not found, 126 not runnable.
fn spawn(
    argv: &[OsString],
    config: Option<&PathBuf>,
    local_path: Option<&PathBuf>,
) -> Result<std::process::Child, (u8, std::io::Error)> {
    let Some((program, args)) = argv.split_first() else {
        return Err((2, std::io::Error::other("no command")));
    };
    let mut cmd = Command::new(program);
    cmd.args(args);
    if std::env::var_os("TRAINPROF_HOOK_LIB").is_none()
        && let Some(lib) = std::env::current_exe().ok().and_then(|exe| launch::hook_lib_near(&exe))
    {
        cmd.env("TRAINPROF_HOOK_LIB", lib);
    }
    if let Some(c) = config {
        cmd.env("SMPROFILER_CONFIG_PATH", c);
    }
    if let Some(p) = local_path {
        cmd.env("TRAINPROF_LOCAL_PATH", p);
    }
    cmd.spawn().map_err(|e| (if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 }, e))
}

/// The shell's convention: the code, or 128 + the signal that ended the process.
fn exit_code(st: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (st.code(), st.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from((128 + sig) & 0xff).unwrap_or(1),
        _ => 1,
    }
}

fn read_resource_config() -> Option<serde_json::Value> {
    let path =
        std::env::var_os("TRAINPROF_RESOURCE_CONFIG").unwrap_or_else(|| DEFAULT_RESOURCE_CONFIG.into());
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}
