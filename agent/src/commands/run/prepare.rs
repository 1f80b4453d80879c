//! Stage 1 of `run`: everything decided before anything starts.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use trainprof_config::{DEFAULT_LOCAL_PATH, FileStatus, Loaded, Loader, Sources};

use super::{Options, end_markers, output_root, repair, summary};
use crate::log;
use crate::process::{child, signals};

/// What [`prepare`] settled.
pub(super) struct Prepared {
    pub opts: Options,
    /// The signals taken, and the pipe they arrive on until [`signals::spawn`] reads it
    /// (`None`: they could not be caught and act as usual).
    pub taken: signals::Taken,
    pub installed: Option<signals::Installed>,
    /// The file limit CMD gets back ([`child::raise_nofile_limit`]).
    pub nofile: Option<libc::rlimit>,
    /// The config file, re-read by the sampler while it runs.
    pub loader: Loader,
    /// The configuration at the start.
    pub loaded: Loaded,
    /// The output folder, pinned and repaired; `None`: nothing is profiled.
    pub root: Option<PathBuf>,
    /// The files under `root` before this run.
    pub before: HashSet<String>,
    /// `--metrics-listen`'s socket, bound.
    pub metrics: Option<std::net::TcpListener>,
}

/// Takes the signals (before any thread exists), checks what a person typed (flags,
/// `TRAINPROF_*` variables, a `--config` file), reads the configuration and chooses the
/// output folder, repairing what dead writers left there.
///
/// Guarantees: an `Err` is exit status 2, said in a line, for a mistake a person typed or,
/// for `agent` (`command_given` false), an output folder that cannot be used; then no
/// thread, no child and no file has been started or written. What the platform wrote (an
/// unusable config file, a fallback folder) degrades with one line and never stops `run`:
/// CMD then runs without profiling.
pub(super) fn prepare(opts: Options, sources: Sources, command_given: bool) -> Result<Prepared, ExitCode> {
    // Before any thread exists, so that every thread inherits SIGTTOU blocked and a signal
    // that comes before the signal thread runs waits in the pipe.
    let taken = signals::Taken::from_dispositions();
    let installed = match signals::install(taken) {
        Ok(i) => Some(i),
        Err(e) => {
            log!(
                "cannot catch SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 ({e}); they will end trainprof at once"
            );
            signals::restore_defaults(&taken);
            None
        }
    };
    // The tree sampler bounds its own descriptors (sample::process::MAX_OPEN); this is
    // room for the rest. The command gets its limit back.
    let nofile = child::raise_nofile_limit();
    // What a person typed (flags, TRAINPROF_* variables, a --config file) is checked before
    // anything starts: a mistake there stops here with exit status 2 (docs/run.md,
    // "Checked first"). What the platform wrote degrades per feature below.
    let bad = crate::commands::check::typed_problems(&sources);
    if !bad.is_empty() {
        for line in bad {
            log!("{line}; nothing was started");
        }
        return Err(ExitCode::from(2));
    }
    // Bound now: an address that cannot be listened on (in use, not this host's) is a
    // mistake in what was typed, said before the trainer starts (docs/metrics.md).
    let metrics = match opts.metrics_listen.map(crate::pipeline::metrics::bind).transpose() {
        Ok(m) => m,
        Err(e) => {
            log!("{e}; nothing was started");
            return Err(ExitCode::from(2));
        }
    };
    let loader = Loader::settled(sources, SETTLE);
    let loaded = loader.loaded().clone();
    if let Some(named) = &opts.config {
        let why = match &loaded.file {
            FileStatus::Read => None,
            FileStatus::Missing => Some("no such file".to_owned()),
            FileStatus::Unusable(why) => Some(why.clone()),
        };
        if let Some(why) = why {
            log!("--config {}: {why}; nothing was started", named.display());
            return Err(ExitCode::from(2));
        }
    }
    match &loaded.file {
        FileStatus::Read => log!("config {}", loaded.path.display()),
        FileStatus::Missing => log!("no config at {}: built-in defaults", loaded.path.display()),
        FileStatus::Unusable(why) => {
            log!("config {} unusable ({why}): profiling is off", loaded.path.display())
        }
    }
    for p in &loaded.config.problems {
        // The file's own problem is the line above.
        if p.key != "file" {
            log!("config: {p}");
        }
    }
    let root = output_folder(&loaded, opts.disable_flag, command_given)?;
    if let Some(root) = &root {
        if let Err(e) = trainprof_output::fs::pin_root(root) {
            log!("cannot pin {}: {e}", root.display());
        }
        repair(root);
        if let Some(at) = end_markers::finished_job(root) {
            log!(
                "{} already holds a finished job (ended {at}): its files stay, this run's are added beside them and the end markers replaced",
                root.display()
            );
        }
    }
    // What is there before this run: the summary counts only this run's files.
    let before = root.as_deref().map(summary::files_under).unwrap_or_default().into_iter().collect();
    Ok(Prepared { opts, taken, installed, nofile, loader, loaded, root, before, metrics })
}

/// The output folder when profiling is on: the configured one or a checked fallback
/// ([`output_root`]). `None` when profiling is off, or (`run`) when no folder can be used;
/// for `agent` that is exit status 2.
fn output_folder(
    loaded: &Loaded,
    disable_flag: bool,
    command_given: bool,
) -> Result<Option<PathBuf>, ExitCode> {
    let config = &loaded.config;
    if !config.enabled {
        // An unusable file already said why.
        if !matches!(loaded.file, FileStatus::Unusable(_)) {
            log!("profiling is off ({})", off_by(disable_flag, &loaded.path));
        }
        return Ok(None);
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let explicit = config.local_path() != Path::new(DEFAULT_LOCAL_PATH);
    // Resolved here, once: everything after (the sampler, the upload, the page's process
    // in `/`, the summary) names the same folder whatever its own current folder.
    let configured = output_root::absolute(config.local_path());
    match output_root::output_root(&configured, explicit, &cwd) {
        Ok((root, note)) => {
            if let Some(n) = note {
                log!("{n}");
            }
            Ok(Some(root))
        }
        Err(e) => {
            log!("{e}");
            if !command_given {
                return Err(ExitCode::from(2));
            }
            log!("running the command without profiling");
            Ok(None)
        }
    }
}

/// How long a config file that does not parse at the start is read again before it is
/// judged (a writer caught half-way).
const SETTLE: Duration = Duration::from_secs(1);

/// Who switched profiling off, for the start-up line.
fn off_by(flag: bool, path: &Path) -> String {
    if flag {
        return "--disable".to_owned();
    }
    match std::env::var("TRAINPROF_DISABLE") {
        Ok(v) if !v.trim().is_empty() => format!("TRAINPROF_DISABLE={v}"),
        _ => format!("DisableProfiler in {}", path.display()),
    }
}
