//! `trainprof`: parses the command line and calls one of the library's commands
//! (`trainprof_agent::commands`); nothing else lives here. See the crate docs of
//! `trainprof_agent`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use trainprof_agent::commands::{check, compare, report, run, trigger};
use trainprof_agent::pipeline::trigger_relay;
use trainprof_config::{OverrideKey, Sources};

#[derive(Parser, Debug)]
#[command(name = "trainprof", version, about = "In-container profiler for ML training jobs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Sample the system into system metrics files until SIGTERM / SIGINT.
    Agent {
        #[command(flatten)]
        flags: AgentFlags,
    },
    /// Run CMD with the agent's sampling around it; exit with CMD's status.
    ///
    /// CMD gets TRAINPROF_HOOK_LIB (when the hook library sits next to this binary) and
    /// the configuration in use; with no config file at all it also gets
    /// TRAINPROF_LOCAL_PATH, so that the trainer records into the same output root. SIGTERM / SIGINT sent to trainprof are passed on to CMD;
    /// when CMD exits every file is sealed, the training_job_end.ts markers are written
    /// and a summary is printed on stderr.
    Run {
        #[command(flatten)]
        flags: AgentFlags,
        /// Do not write report.html into the output folder when CMD ends.
        #[arg(long)]
        no_report: bool,
        /// The command and its arguments (after `--`).
        #[arg(required = true, last = true, value_name = "CMD")]
        command: Vec<std::ffi::OsString>,
    },
    /// Statistics and findings of a profiled job: one offline HTML page, or JSON with --json.
    ///
    /// PATH is a LocalPath or s3://bucket/prefix (the upload's credential chain). The page
    /// goes to PATH/report.html (./report.html for S3) unless -o names a file; an existing
    /// file is never replaced. Keys and rules: docs/report.md.
    Report {
        /// The LocalPath or s3://bucket/prefix.
        path: String,
        /// The HTML file to create.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Print the statistics and findings as JSON on stdout (without the chart series);
        /// with -o the page is written too.
        #[arg(long)]
        json: bool,
        /// S3-compatible endpoint for an s3:// PATH, e.g. http://127.0.0.1:9000
        #[arg(long, value_name = "URL")]
        s3_endpoint: Option<String>,
        /// SageMaker's behaviour: a rule needs N datapoints before it judges (at most
        /// SageMaker's 1000 system samples; 10 seconds of dataloader events) and is not
        /// evaluated below. Without it, a rule with less than its patience of data is judged on
        /// what there is and marked preliminary.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1000))]
        patience: Option<u64>,
    },
    /// One Chrome trace (gzipped JSON) of every node and rank, for ui.perfetto.dev.
    ///
    /// Steps, phases, ops and kernels as slices per rank, Python windows, and the system
    /// metrics as counter tracks per node, on one epoch-microsecond axis, each node's events
    /// moved by its clock offset as the collectives estimate it (stderr says by how much). Written to
    /// PATH/trace.json.gz (./trace.json.gz for S3) unless -o names a file; an existing file
    /// is never replaced.
    Trace {
        /// The LocalPath or s3://bucket/prefix.
        path: String,
        /// The file to create.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Only the time of steps A to B (step numbers of any mode).
        #[arg(long, value_name = "A-B", value_parser = trainprof_report::trace::parse_steps, conflicts_with_all = ["start", "end"])]
        steps: Option<(i64, i64)>,
        /// Only from this time on (epoch seconds).
        #[arg(long, value_name = "S", value_parser = finite_seconds)]
        start: Option<f64>,
        /// Only up to this time (epoch seconds).
        #[arg(long, value_name = "S", value_parser = finite_seconds)]
        end: Option<f64>,
        /// Times as recorded: do not move each node's events by its clock offset as the
        /// collectives estimate it (docs/report.md, "The trace").
        #[arg(long)]
        unaligned: bool,
        /// Instead of the merged trace, one new tar: each node's trace with its times as
        /// recorded, and perfetto_manifest.json giving each file's machine and clock offset
        /// (Perfetto merges them). docs/report.md, "The trace".
        #[arg(long, value_name = "FILE", conflicts_with_all = ["output", "unaligned"])]
        per_node_archive: Option<PathBuf>,
        /// S3-compatible endpoint for an s3:// PATH.
        #[arg(long, value_name = "URL")]
        s3_endpoint: Option<String>,
    },
    /// Compare two jobs: step time per mode (B ÷ A of the medians, a 95 % bootstrap
    /// interval, a verdict), what moved, what makes them hard to compare; a CI gate.
    ///
    /// A and B are LocalPaths or s3:// prefixes, read as `report` reads them. A summary goes
    /// to stderr; -o writes the page (never over a file), --json prints the comparison.
    /// Exit status: 0 compared, 1 --fail-if-slower failed, 2 unusable input. docs/report.md.
    Compare(CompareFlags),
    /// Profile a live job now: every rank of the node opens the windows asked for on the
    /// same step, for --steps steps.
    ///
    /// TARGET is the job's LocalPath (the hook of every running trainer answers through
    /// TARGET/trigger/), or its s3://bucket/prefix: every node whose agent runs with
    /// --s3-triggers relays the request and the answers (the AWS credential chain, and
    /// --s3-endpoint or AWS_ENDPOINT_URL, as `report` reads S3). The start is the first multiple of --roundup past the furthest
    /// rank's step and a margin. Prints, per rank, whether it was reached, the steps and
    /// where the files go (and, for S3, each node that did not relay). Exit status: 0 when a
    /// rank armed, 1 when none was reached (no trainer running, no agent answered, profiling
    /// disabled, not allowed), 2 for an unusable target.
    /// docs/trigger.md.
    Trigger(TriggerFlags),
    /// The page at the end of `run`, made in a child process with bounds of its own
    /// (docs/on-disk.md); not for people.
    #[command(name = "page-child", hide = true)]
    PageChild { root: PathBuf, source: String },
    /// Work with the profiler configuration (SMPROFILER_CONFIG_PATH).
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

/// The flags of `compare`.
#[derive(Args, Debug)]
struct CompareFlags {
    /// The baseline: a LocalPath or s3://bucket/prefix.
    a: String,
    /// The run compared with it.
    b: String,
    /// The HTML page to create.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Print the comparison as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Exit with 1 when B's median step is slower than A's by more than PCT per cent and the
    /// 95 % interval is above PCT too.
    #[arg(long, value_name = "PCT")]
    fail_if_slower: Option<f64>,
    /// Only this step mode (train, eval, …) [default: every mode both have; movers and gate: TRAIN]
    #[arg(long, value_name = "MODE")]
    mode: Option<String>,
    /// A change smaller than this (per cent) is no difference [default: 1]
    #[arg(long, value_name = "PCT")]
    noise: Option<f64>,
    /// Steps left out at the start of each rank and mode [default: 10]
    #[arg(long, value_name = "N")]
    warmup: Option<usize>,
    /// S3-compatible endpoint for an s3:// A or B.
    #[arg(long, value_name = "URL")]
    s3_endpoint: Option<String>,
    /// As for `report`: datapoints a rule needs before it judges.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1000))]
    patience: Option<u64>,
}

/// The flags of `trigger`.
#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("what").required(true).multiple(true))]
struct TriggerFlags {
    /// The detailed window (torch.profiler / the TF profiler; module and op events).
    #[arg(long, group = "what")]
    detailed: bool,
    /// The Python-profiling window (cProfile or pyinstrument, as configured).
    #[arg(long, group = "what")]
    python: bool,
    /// The dataloader window.
    #[arg(long, group = "what")]
    dataloader: bool,
    /// The native CPU-sampling window.
    #[arg(long, group = "what")]
    native: bool,
    /// The memory window (PyTorch on CUDA only): the caching allocator's history for the steps, one snapshot per rank under framework/memory/<node>/.
    #[arg(long, group = "what")]
    memory: bool,
    /// Every rank's Python and native stacks now, written as a hang dump of kind `requested`; the job goes on.
    #[arg(long, group = "what")]
    stacks: bool,
    /// Steps the windows span.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    steps: u64,
    /// The first step is a multiple of R.
    #[arg(long, value_name = "R", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    roundup: u64,
    /// Seconds to wait for the ranks' answers (half for the first phase), at most 600 [default: 10; 30 for an s3:// TARGET]
    #[arg(long, value_name = "S", value_parser = wait_seconds)]
    wait: Option<f64>,
    /// S3-compatible endpoint for an s3:// TARGET, e.g. http://127.0.0.1:9000
    #[arg(long, value_name = "URL")]
    s3_endpoint: Option<String>,
    /// The job's LocalPath, or its s3://bucket/prefix (every node whose agent runs with --s3-triggers).
    #[arg(value_name = "TARGET")]
    target: String,
}

/// `--wait`: seconds, above 0 and at most `trigger::MAX_WAIT_S`.
fn wait_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= trigger::MAX_WAIT_S => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds above 0 and at most {}", trigger::MAX_WAIT_S)),
    }
}

/// The flags of `agent` and `run`.
#[derive(Args, Debug)]
struct AgentFlags {
    /// The configuration file [default: $SMPROFILER_CONFIG_PATH, else /opt/ml/input/config/profilerconfig.json]
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// S3-compatible endpoint for the upload, e.g. http://127.0.0.1:9000
    #[arg(long, value_name = "URL")]
    s3_endpoint: Option<String>,
    /// Keep uploaded files on disk (listed in <LocalPath>/.trainprof/uploaded) instead of deleting them
    #[arg(long)]
    keep_local: bool,
    /// Bytes of files waiting for S3 above which the oldest are deleted (counted)
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30)]
    spool_max_bytes: u64,
    /// Seconds allowed at the end (SIGTERM, or CMD's exit) to upload what is left
    #[arg(long, value_name = "S", default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=3600))]
    upload_deadline_s: u64,
    /// Files larger than this are uploaded in parts (of at least 5 MiB)
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20, hide = true)]
    s3_multipart_bytes: u64,
    /// Serve the latest tick for Prometheus at http://ADDR:PORT/metrics (off by default; see docs/metrics.md), e.g. 127.0.0.1:9400
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Relay `trainprof trigger s3://…` requests from the upload's prefix to this node's trainer (off by default; one LIST of <prefix>/trigger/ per poll; see docs/trigger.md)
    #[arg(long)]
    s3_triggers: bool,
    /// Seconds between two looks for requests with --s3-triggers, 1..=300
    #[arg(long, value_name = "S", default_value_t = trigger_relay::DEFAULT_POLL_S, requires = "s3_triggers",
          value_parser = clap::value_parser!(u64).range(trigger_relay::MIN_POLL_S..=trigger_relay::MAX_POLL_S))]
    s3_trigger_poll: u64,
    #[command(flatten)]
    overrides: OverrideFlags,
}

impl AgentFlags {
    /// The library's options, and the configuration's sources with the flags applied.
    fn into_options(self) -> (run::Options, Sources) {
        let mut sources = Sources::from_process_env();
        if let Some(p) = &self.config {
            sources = sources.with_config_path(p);
        }
        let opts = run::Options {
            config: self.config,
            local_path_flag: self.overrides.local_path.is_some(),
            disable_flag: self.overrides.disable,
            report: false,
            upload: run::UploadOptions {
                endpoint: self.s3_endpoint,
                keep_local: self.keep_local,
                spool_max_bytes: self.spool_max_bytes,
                deadline: std::time::Duration::from_secs(self.upload_deadline_s),
                multipart_bytes: self.s3_multipart_bytes,
            },
            metrics_listen: self.metrics_listen,
            s3_triggers: self.s3_triggers.then(|| std::time::Duration::from_secs(self.s3_trigger_poll)),
        };
        (opts, self.overrides.apply(sources))
    }
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Print the effective configuration, when each feature's window opens, and every problem.
    ///
    /// Exit status: 0 when the file was read (with problems or not; 1 with --strict when
    /// there is any), 2 when it is missing, unreadable or not a JSON object, or when a flag
    /// or TRAINPROF_* variable has a bad value.
    Check {
        /// The file to check [default: $SMPROFILER_CONFIG_PATH, else /opt/ml/input/config/profilerconfig.json]
        path: Option<PathBuf>,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Exit with status 1 when there is any problem.
        #[arg(long)]
        strict: bool,
        /// Also list which of the steps 0..N-1 each step-based feature profiles.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
        steps: Option<u64>,
        /// The trainer's framework, which decides what a step is: PyTorch counts every mode
        /// together (global steps), TensorFlow each mode on its own [default: both are said]
        #[arg(long, value_enum, value_name = "NAME")]
        framework: Option<FrameworkArg>,
        #[command(flatten)]
        overrides: OverrideFlags,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum FrameworkArg {
    #[value(alias = "torch")]
    Pytorch,
    #[value(alias = "tf", alias = "keras")]
    Tensorflow,
}

impl From<FrameworkArg> for check::Framework {
    fn from(f: FrameworkArg) -> Self {
        match f {
            FrameworkArg::Pytorch => check::Framework::PyTorch,
            FrameworkArg::Tensorflow => check::Framework::TensorFlow,
        }
    }
}

/// Flags that override the file (and the TRAINPROF_* variables).
#[derive(Args, Debug)]
struct OverrideFlags {
    /// Output root [overrides ProfilingParameters.LocalPath, TRAINPROF_LOCAL_PATH]
    #[arg(long, value_name = "DIR")]
    local_path: Option<String>,
    /// System sampling interval, 100..=60000 [overrides ProfilingIntervalInMilliseconds, TRAINPROF_INTERVAL_MS]
    #[arg(long, value_name = "N")]
    interval_ms: Option<String>,
    /// Upload destination s3://bucket/prefix [overrides S3OutputPath, TRAINPROF_S3_OUTPUT_PATH]
    #[arg(long, value_name = "URL")]
    s3: Option<String>,
    /// Switch profiling off [overrides DisableProfiler, TRAINPROF_DISABLE]
    #[arg(long)]
    disable: bool,
}

impl OverrideFlags {
    fn apply(self, mut s: Sources) -> Sources {
        for (key, flag, value) in [
            (OverrideKey::LocalPath, "--local-path", self.local_path),
            (OverrideKey::IntervalMs, "--interval-ms", self.interval_ms),
            (OverrideKey::S3OutputPath, "--s3", self.s3),
            (OverrideKey::Disable, "--disable", self.disable.then(|| "1".to_owned())),
        ] {
            if let Some(v) = value {
                s = s.with_flag(key, flag, v);
            }
        }
        s
    }
}

/// `--start` / `--end`: epoch seconds, finite and not negative.
fn finite_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a time in epoch seconds")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Agent { flags } => {
            let (opts, sources) = flags.into_options();
            run::main(opts, sources, None)
        }
        Command::Run { flags, no_report, command } => {
            let (mut opts, sources) = flags.into_options();
            opts.report = !no_report;
            run::main(opts, sources, Some(command))
        }
        Command::Report { path, output, json, s3_endpoint, patience } => {
            report::report(&report::ReportArgs { path, output, json, s3_endpoint, patience })
        }
        Command::Trace { path, output, steps, start, end, unaligned, per_node_archive, s3_endpoint } => {
            let clip = trainprof_report::trace::Clip { steps, start_s: start, end_s: end };
            report::trace(&report::TraceArgs { path, output, s3_endpoint, clip, unaligned, per_node_archive })
        }
        Command::Compare(f) => compare::compare(&compare::CompareArgs {
            a: f.a,
            b: f.b,
            output: f.output,
            json: f.json,
            fail_if_slower: f.fail_if_slower,
            mode: f.mode,
            noise: f.noise,
            warmup: f.warmup,
            s3_endpoint: f.s3_endpoint,
            patience: f.patience,
        }),
        Command::Trigger(f) => {
            let features = [
                ("detailed", f.detailed),
                ("dataloader", f.dataloader),
                ("python", f.python),
                ("native", f.native),
                ("memory", f.memory),
            ]
            .into_iter()
            .filter_map(|(name, on)| on.then_some(name))
            .collect();
            trigger::trigger(&trigger::TriggerArgs {
                target: f.target,
                features,
                stacks: f.stacks,
                steps: f.steps,
                roundup: f.roundup,
                wait: f.wait.map(std::time::Duration::from_secs_f64),
                s3_endpoint: f.s3_endpoint,
            })
        }
        Command::PageChild { root, source } => report::page_child::child_main(&root, &source),
        Command::Config {
            command: ConfigCommand::Check { path, json, steps, strict, framework, overrides },
        } => {
            let mut sources = Sources::from_process_env();
            if let Some(p) = path {
                sources = sources.with_config_path(p);
            }
            let sources = overrides.apply(sources);
            check::main(&sources, json, strict, steps, framework.map(Into::into))
        }
    }
}
