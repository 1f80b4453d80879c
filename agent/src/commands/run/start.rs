//! Stage 2 of `run`: the uploader, CMD, the signal thread and the sampling thread.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use trainprof_config::{FileStatus, Loader, Reload};
use trainprof_output::fs as ofs;
use trainprof_output::node::{ResourceConfig, SystemNode};
use trainprof_output::protocol::agent_cost;
use trainprof_output::protocol::node_record::{self, JobIdentity, NodeGpu, NodeRecord};
use trainprof_output::protocol::system_line::round_us;

use super::prepare::Prepared;
use super::{Job, UploadOptions, Uploading, output_root};
use crate::log;
use crate::pipeline::cost;
use crate::pipeline::metrics;
use crate::pipeline::sample::probe::{ProbeContext, probe_samplers};
use crate::pipeline::sample::process::thread_cpu_us;
use crate::pipeline::sample::tree_pids::TreePids;
use crate::pipeline::sample::{Roots, gpu};
use crate::pipeline::sink::LoopCounts;
use crate::pipeline::sinks;
use crate::pipeline::tick::{Clock as _, LoopSettings, Reconfigure, Stop, SystemClock, Ticker};
use crate::pipeline::{trigger_relay, upload};
use crate::process::{child, signals};
use trainprof_output::protocol::request::REQUEST_DIR;

/// What [`start`] started.
pub(super) struct Started {
    pub job: Job,
    /// CMD, and what passes signals on to it and waits for it (`None`: `agent`).
    pub child: Option<(Child, Arc<child::Trainer>)>,
    /// The sampling thread's counts, sent when it has sealed its file (`None`: no sampling
    /// thread).
    pub sampling: Option<mpsc::Receiver<LoopCounts>>,
    /// Stops the sampling loop (and `agent`'s wait).
    pub stop: Stop,
}

/// Starts the uploader, then CMD, then the signal thread and the sampling thread: CMD first
/// of the threads that matter to it, so that the trainer starts even if sampling cannot.
///
/// Guarantees: only a CMD that cannot be started is an `Err` (127 not found, 126 not
/// runnable, as a shell says). An uploader, a signal thread or a sampling thread that
/// cannot start is one line and the job goes on without it; a hung or panicking sampler
/// cannot keep [`super::wait`] from returning CMD's status (it runs on its own thread).
pub(super) fn start(p: Prepared, command: Option<Vec<OsString>>) -> Result<Started, ExitCode> {
    let Prepared { opts, taken, installed, nofile, loader, loaded, root, before, metrics } = p;
    let config = loaded.config;
    let uploader = match (&root, &config.s3_output_path) {
        (Some(root), Some(s3)) => start_upload(root, s3, &opts.upload),
        _ => None,
    };
    let relay = opts.s3_triggers.and_then(|poll| start_relay(root.as_deref(), uploader.as_ref(), poll));
    let waker = uploader.as_ref().map(|u| u.0.waker());
    let stop = Stop::new();
    let started = Instant::now();

    // The child first: the trainer must start even if sampling cannot.
    let child = match &command {
        None => None,
        Some(argv) => {
            let local_path_env =
                trainer_local_path(root.as_deref(), config.local_path(), opts.local_path_flag, &loaded.file);
            let terminal = child::Terminal::foreground();
            let started = spawn(
                argv,
                opts.config.as_ref(),
                local_path_env.as_ref(),
                config.enabled,
                (terminal.as_ref(), nofile),
            );
            match started {
                Ok(c) => {
                    let trainer = Arc::new(child::Trainer::new(c.id(), terminal));
                    Some((c, trainer))
                }
                Err((code, e)) => {
                    child::Trainer::not_started(terminal);
                    log!("cannot run {}: {e}", argv[0].to_string_lossy());
                    return Err(ExitCode::from(code));
                }
            }
        }
    };
    let child_pid = child.as_ref().map(|(c, _)| c.id());
    let trainer = child.as_ref().map(|(_, t)| Arc::clone(t));
    if let Some(installed) = installed
        && let Err(e) = signals::spawn(installed, on_signal(trainer, stop.clone()))
    {
        log!(
            "cannot start the signal thread ({e}): SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 act as usual"
        );
        signals::restore_defaults(&taken);
    }

    // Sampling runs on its own thread: a hung NVML call or a panic there must not keep
    // `run` from returning the trainer's status.
    if metrics.is_some() && root.is_none() {
        log!("--metrics-listen: nothing is sampled, so no metrics are served");
    }
    let sampling = root.clone().and_then(|root| {
        let (done_tx, done_rx) = mpsc::channel();
        let stop = stop.clone();
        let reload = ConfigReload { loader, next_at: RELOAD_EVERY };
        let spawned = std::thread::Builder::new().name("trainprof-sampler".into()).spawn(move || {
            let clock = SystemClock::new(stop);
            let counts = sample(&root, &clock, child_pid, config.interval_ms, (waker, metrics), reload);
            let _ = done_tx.send(counts);
        });
        match spawned {
            Ok(_) => Some(done_rx),
            Err(e) => {
                log!("cannot start the sampling thread: {e}");
                None
            }
        }
    });

    let uploader =
        uploader.map(|(handle, url, options)| Uploading { handle: Some(handle), url, options, early: None });
    let want_page = opts.report && command.is_some();
    let job = Job { root, before, upload: opts.upload, want_page, uploader, started, relay };
    Ok(Started { job, child, sampling, stop })
}

/// What the signal thread does with each signal `run` takes.
fn on_signal(
    trainer: Option<Arc<child::Trainer>>,
    stop: Stop,
) -> impl FnMut(signals::Received) + Send + 'static {
    move |sig: signals::Received| match &trainer {
        // Every signal run takes, to the command's process group, once: a terminal's
        // signals go to that group (the terminal's foreground) and never to run.
        Some(t) => match t.pass_on(sig.signo) {
            child::Passed::Sent => log!("{} passed on to {}'s process group", sig.name(), t.pid()),
            // The command is gone: what `run` still does is bounded anyway, but a stop
            // signal ends the page now (docs/report.md, "At the end of trainprof run").
            child::Passed::Gone if sig.stops() => {
                if !crate::commands::report::page_child::stopped() {
                    log!("{}: the command has exited; the report stops", sig.name());
                }
                crate::commands::report::page_child::stop();
            }
            child::Passed::Gone => {}
            child::Passed::KernelSendsIt => log!(
                "{}: the terminal hung up; the kernel sends it to {}'s process group (not passed on twice)",
                sig.name(),
                t.pid()
            ),
            child::Passed::Failed(e) => log!("cannot pass {} on to {}: {e}", sig.name(), t.pid()),
        },
        None if sig.stops() => {
            log!("{}: sealing files and stopping", sig.name());
            stop.request();
        }
        None => log!("{}: no command to pass it on to; sampling goes on", sig.name()),
    }
}

/// The config file is read again at most this often while sampling (by content, as the
/// hook does; docs/configuration.md, "Reload").
const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// The sampler's view of the config file: re-read at most once a second; the interval and
/// DisableProfiler of a changed file apply at the next tick. A file that became unusable
/// (caught half-written, say) keeps the settings in use, with one line.
struct ConfigReload {
    loader: Loader,
    next_at: Duration,
}

impl Reconfigure for ConfigReload {
    fn poll(&mut self, mono: Duration) -> Option<LoopSettings> {
        if mono < self.next_at {
            return None;
        }
        self.next_at = mono + RELOAD_EVERY;
        if self.loader.reload() == Reload::Unchanged {
            return None;
        }
        let loaded = self.loader.loaded();
        match &loaded.file {
            FileStatus::Unusable(why) => {
                log!("config {} unusable ({why}): keeping the settings in use", loaded.path.display());
                return None;
            }
            FileStatus::Missing => log!("config {} is gone: built-in defaults", loaded.path.display()),
            FileStatus::Read => {}
        }
        for p in &loaded.config.problems {
            log!("config: {p}");
        }
        let c = &loaded.config;
        Some(LoopSettings { interval: Duration::from_millis(u64::from(c.interval_ms)), enabled: c.enabled })
    }
}

/// The uploader, with the bucket and client options it was started with.
fn start_upload(
    root: &Path,
    s3: &str,
    flags: &UploadOptions,
) -> Option<(upload::Handle, crate::s3::store::S3Url, crate::s3::store::S3Options)> {
    let url = match crate::s3::store::S3Url::parse(s3) {
        Ok(u) => u,
        Err(e) => {
            log!("S3OutputPath: {e}; files stay under {}", root.display());
            return None;
        }
    };
    let options = crate::s3::store::S3Options {
        endpoint: flags.endpoint.clone(),
        multipart_threshold: flags.multipart_bytes,
        ..crate::s3::store::S3Options::default()
    };
    let mut settings = upload::Settings::new(root);
    settings.keep_local = flags.keep_local;
    settings.spool_max_bytes = flags.spool_max_bytes;
    let via = flags.endpoint.as_deref().map(|e| format!(" via {e}")).unwrap_or_default();
    match upload::spawn_s3(url.clone(), options.clone(), settings) {
        Ok(h) => {
            let kept = if flags.keep_local { "kept" } else { "deleted" };
            log!(
                "uploading sealed files under {} to {s3}{via} (local copies {kept} once uploaded)",
                root.display()
            );
            Some((h, url, options))
        }
        Err(e) => {
            log!("cannot start the uploader ({e}); files stay under {}", root.display());
            None
        }
    }
}

/// The S3 trigger relay (`--s3-triggers`; docs/trigger.md, "Every node of a job through
/// S3"), on the uploader's bucket, prefix and client options. Without an upload there is
/// nothing to relay from: one line, and the job goes on.
fn start_relay(
    root: Option<&Path>,
    uploader: Option<&(upload::Handle, crate::s3::store::S3Url, crate::s3::store::S3Options)>,
    poll: Duration,
) -> Option<trigger_relay::Relay> {
    let (Some(root), Some((_, url, options))) = (root, uploader) else {
        log!("--s3-triggers: no upload to S3 (S3OutputPath), so no trigger requests are relayed");
        return None;
    };
    let node = SystemNode::from_env(read_resource_config().as_ref(), |k| std::env::var(k).ok()).to_string();
    let settings = trigger_relay::Settings { root: root.to_path_buf(), node: node.clone(), poll };
    let prefix = url.key(REQUEST_DIR);
    match trigger_relay::spawn(url.clone(), options.clone(), settings) {
        Ok(r) => {
            log!(
                "relaying trainprof trigger requests from s3://{}/{prefix}/ to {} as {node} (one look every {} s)",
                url.bucket,
                root.join(REQUEST_DIR).display(),
                poll.as_secs()
            );
            Some(r)
        }
        Err(e) => {
            log!(
                "cannot start the S3 trigger relay ({e}); trainprof trigger s3://… does not reach this node"
            );
            None
        }
    }
}

/// The sampling thread: probes, ticks into the sinks until stopped, finishes them.
fn sample(
    root: &Path,
    clock: &SystemClock,
    trainer: Option<u32>,
    interval_ms: u32,
    (waker, metrics): (Option<upload::Waker>, Option<std::net::TcpListener>),
    reload: ConfigReload,
) -> LoopCounts {
    cost::enroll(cost::Part::Start);
    let roots = Roots::host();
    let nvml_lib = gpu::lib_from_env();
    let now = || clock.mono();
    let tree = TreePids::default();
    let cx =
        ProbeContext { roots: &roots, now: &now, trainer, nvml_lib: nvml_lib.as_deref(), tree: tree.clone() };
    let probed = probe_samplers(&cx);
    let resource = read_resource_config();
    let node = SystemNode::from_env(resource.as_ref(), |k| std::env::var(k).ok());
    let identity = job_identity(resource.as_ref());
    let info = identity.summary(&probed.gpu_record);
    write_node_record(root, &node.to_string(), probed.gpu_record.clone(), identity);
    let interval = Duration::from_millis(u64::from(interval_ms));
    let sinks = sinks::build(sinks::Outputs {
        root,
        node,
        on_seal: waker,
        proc: &roots.proc,
        tree,
        metrics: metrics.map(|listener| {
            (
                listener,
                metrics::Labels {
                    node: node.to_string(),
                    gpu_uuid: probed.gpu_uuids.clone(),
                    job_info: info,
                },
            )
        }),
    });
    let mut ticker = Ticker::new(probed.samplers, sinks, interval);
    ticker.reconfigure_with(Box::new(reload));
    log!(
        "sampling every {interval_ms} ms into {} as {node}: {} ({} cores, {} GPUs)",
        root.join("system").display(),
        ticker.sampler_names().join(", "),
        probed.cores,
        probed.gpus
    );
    if !probed.absent.is_empty() {
        log!("not sampled: {}", probed.absent.join("; "));
    }
    let cpu_before = thread_cpu_us();
    ticker.run(clock);
    let mut c = ticker.counts();
    c.sampling_cpu_us = thread_cpu_us().saturating_sub(cpu_before);
    let cx = cost::Context {
        interval_ms: u64::from(interval_ms),
        gpus: u32::try_from(probed.gpus).unwrap_or(u32::MAX),
    };
    write_record(
        root,
        agent_cost::FOLDER,
        &node.to_string(),
        "cost record",
        &agent_cost::to_bytes(&cost::record(&node.to_string(), cx)),
    );
    c
}

/// The job's identity on this node (docs/formats.md, "Job identity"): the agent's own
/// environment (a variable that is not UTF-8 is taken lossily), SageMaker's resource config
/// and the host name.
fn job_identity(resource: Option<&ResourceConfig>) -> JobIdentity {
    let var = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
    // The kernel's own file: at most 64 bytes, no link planted by the trainer.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    let resource = resource.map(|r| (r.current_host.as_deref(), r.hosts.as_ref().map(Vec::len)));
    JobIdentity::from_env(var, resource, host.as_deref().map(str::trim))
}

/// The node record (docs/formats.md, "Node record"): this node's GPUs and the job's identity,
/// once, as a new `system/node/<node>/<µs>.json` (never over a file: a name that is taken is
/// passed by). A record that cannot be written is one line; sampling goes on without it.
fn write_node_record(root: &Path, node: &str, gpus: Vec<NodeGpu>, job: JobIdentity) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let record =
        NodeRecord { node: node.to_owned(), timestamp: round_us(now.as_secs_f64()), gpus, job: Some(job) };
    write_record(root, node_record::FOLDER, node, "node record", &node_record::to_bytes(&record));
}

/// One record of the agent's, `<folder>/<node>/<µs>.json` (never over a file: a name that
/// is taken is passed by); one line when it cannot be written.
fn write_record(root: &Path, folder: &str, node: &str, what: &str, bytes: &[u8]) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let folder = format!("{folder}/{node}");
    let dir = match ofs::Dir::open_root(root, false).and_then(|d| d.sub(&folder, true)) {
        Ok(d) => d,
        Err(e) => {
            log!("cannot write the {what} into {folder}: {e}");
            return;
        }
    };
    let us = u64::try_from(now.as_micros()).unwrap_or(u64::MAX);
    let tag = std::process::id().to_string();
    for k in 0..16 {
        let name = node_record::file_name(us.saturating_add(k));
        match ofs::write_new(&dir, &name, &tag, bytes) {
            Ok(true) => return,
            Ok(false) => continue,
            Err(e) => {
                log!("cannot write the {what} {folder}/{name}: {e}");
                return;
            }
        }
    }
    log!("cannot write the {what}: 16 names taken in {folder}");
}

/// The `TRAINPROF_LOCAL_PATH` the trainer gets: the agent's root when that root was chosen
/// here (given by flag, fallen back from `configured`, or the built-in default because there
/// is no config file at all: `trainprof run` on its defaults profiles the trainer too).
/// Otherwise none: the trainer reads the same config, and a file without
/// ProfilingParameters keeps smdebug's meaning (the hook does nothing).
fn trainer_local_path(
    root: Option<&Path>,
    configured: &Path,
    by_flag: bool,
    file: &FileStatus,
) -> Option<PathBuf> {
    let root = root?;
    // The root was made absolute ([`output_root::absolute`]); `configured` as the file has it.
    (by_flag || root != output_root::absolute(configured) || matches!(file, FileStatus::Missing))
        .then(|| root.to_path_buf())
}

/// Starts the command with what the Python package needs in its environment. The error
/// carries the shell's exit code for it: 127 not found, 126 not runnable.
fn spawn(
    argv: &[OsString],
    config: Option<&PathBuf>,
    local_path: Option<&PathBuf>,
    enabled: bool,
    (terminal, nofile): (Option<&child::Terminal>, Option<libc::rlimit>),
) -> Result<std::process::Child, (u8, std::io::Error)> {
    let Some((program, args)) = argv.split_first() else {
        return Err((2, std::io::Error::other("no command")));
    };
    let mut cmd = Command::new(program);
    cmd.args(args);
    child::prepare(&mut cmd, terminal, nofile);
    signals::unblock_in_child(&mut cmd);
    if !enabled {
        // Off for the trainer too (--disable, or a config file that cannot be trusted).
        cmd.env("TRAINPROF_DISABLE", "1");
    }
    // Also when off: the library honours TRAINPROF_DISABLE, and a trainer that loads it
    // must find it.
    if std::env::var_os("TRAINPROF_HOOK_LIB").is_none()
        && let Some(lib) = std::env::current_exe().ok().and_then(|exe| hook_lib_near(&exe))
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

/// `libtrainprof_hook.so` next to the binary, or in `../lib` from it.
fn hook_lib_near(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent()?;
    [dir.join("libtrainprof_hook.so"), dir.join("../lib/libtrainprof_hook.so")]
        .into_iter()
        .find(|p| p.is_file())
}

fn read_resource_config() -> Option<ResourceConfig> {
    let path = ResourceConfig::path(|k| std::env::var(k).ok());
    // Non-blocking and by `fstat`: a FIFO planted there cannot hang the sampler.
    ResourceConfig::parse(&trainprof_config::read_platform_file(&path).ok()??)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trainer_gets_the_root_only_when_it_was_chosen_here() {
        let root = Path::new("/out");
        let read = FileStatus::Read;
        assert_eq!(trainer_local_path(Some(root), root, false, &read), None);
        assert_eq!(trainer_local_path(Some(root), root, true, &read).as_deref(), Some(root));
        let fallback = Path::new("/opt/ml/output/profiler");
        assert_eq!(trainer_local_path(Some(root), fallback, false, &read).as_deref(), Some(root));
        assert_eq!(trainer_local_path(Some(root), root, false, &FileStatus::Missing).as_deref(), Some(root));
        let unusable = FileStatus::Unusable("not JSON".into());
        assert_eq!(trainer_local_path(Some(root), root, false, &unusable), None);
        assert_eq!(trainer_local_path(None, root, true, &FileStatus::Missing), None);
        // A relative LocalPath in the file is the same folder as the root made absolute.
        let relative = Path::new("out");
        let resolved = std::env::current_dir().unwrap().join(relative);
        assert_eq!(trainer_local_path(Some(&resolved), relative, false, &read), None);
    }
}
