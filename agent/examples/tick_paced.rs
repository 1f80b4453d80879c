//! Benchmark (not a test): where a running agent's CPU per tick goes, measured inside the
//! process with `CLOCK_THREAD_CPUTIME_ID` (user + system of this thread), with the ticks
//! paced by real 100 ms sleeps like the agent's loop, so every tick starts with caches as
//! cold as the agent's. Results and the command go to BENCHMARKS.md ("the agent against
//! its floor").
//!
//! Ticks alternate between two kinds:
//! * floor: what `bench/c/floor.c` does, in this process: every file the samplers keep
//!   open (found in `/proc/self/fd`) re-read from offset 0, and one `write` of the last
//!   agent tick's size;
//! * agent: every sampler of this machine (`probe_samplers`, no trainer), then the
//!   writer's `write_tick` (formatting and the one `write`), timed apart; every other
//!   agent tick goes through the loop's sink seam instead (`Box<dyn Sink>` holding a
//!   `SystemFiles` on a writer of its own, as `trainprof run` builds it), so the seam's
//!   cost is the difference between the two write figures.
//!
//!     cargo run --release -p trainprof-agent --example tick_paced [TICKS]

use std::io::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use trainprof_agent::pipeline::sample::probe::{ProbeContext, probe_samplers};
use trainprof_agent::pipeline::sample::tree_pids::TreePids;
use trainprof_agent::pipeline::sample::{Metrics, ProcFile, Roots};
use trainprof_agent::pipeline::sink::{Sink, Tick};
use trainprof_agent::pipeline::sinks::SystemFiles;
use trainprof_agent::pipeline::system_file::SystemWriter;
use trainprof_output::node::SystemNode;

use trainprof_agent::pipeline::sample::process::thread_cpu_ns;

const TICK: Duration = Duration::from_millis(100);

/// The files under /proc and /sys this process holds open (the samplers').
fn kept_open() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| p.starts_with("/proc/") || p.starts_with("/sys/"))
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ticks: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let roots = Roots::host();
    let start = Instant::now();
    let now = move || start.elapsed();
    let cx =
        ProbeContext { roots: &roots, now: &now, trainer: None, nvml_lib: None, tree: TreePids::default() };
    let mut probed = probe_samplers(&cx);
    let paths = kept_open();
    let mut files = paths.iter().map(ProcFile::open).collect::<Result<Vec<_>, _>>()?;
    let dir = tempfile::tempdir()?;
    let mut writer = SystemWriter::new(dir.path(), SystemNode::new(1));
    let sink_dir = tempfile::tempdir()?;
    let mut sink: Box<dyn Sink> =
        Box::new(SystemFiles::new(SystemWriter::new(sink_dir.path(), SystemNode::new(1)), None));
    let (mut sink_ns, mut n_sink) = (0u64, 0u64);
    let mut floor_out = std::fs::File::create_new(dir.path().join("floor.json"))?;
    let mut metrics = Metrics::new();
    let mut line = vec![b'x'; 64];
    let mut floor_write_ns = 0u64;
    let (mut floor_ns, mut sample_ns, mut write_ns, mut n_floor, mut n_agent) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut bytes = 0usize;
    let t0 = Instant::now();
    for k in 1..=ticks {
        let due = t0 + TICK * k as u32;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let wall = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
        if k % 2 == 0 {
            let c = thread_cpu_ns();
            for f in &mut files {
                let _ = f.read()?;
            }
            let r = thread_cpu_ns();
            floor_out.write_all(&line[..bytes.max(64)])?;
            let w = thread_cpu_ns();
            floor_ns += w - c;
            floor_write_ns += w - r;
            n_floor += 1;
        } else {
            let c = thread_cpu_ns();
            metrics.clear();
            for s in &mut probed.samplers {
                let _ = s.sample(now(), &mut metrics);
            }
            let m = thread_cpu_ns();
            if k % 4 == 3 {
                sink.tick(&Tick { wall_s: wall, metrics: metrics.as_slice(), last: false });
                sink_ns += thread_cpu_ns() - m;
                n_sink += 1;
                sample_ns += m - c;
                continue;
            }
            writer.write_tick(wall, metrics.as_slice())?;
            let w = thread_cpu_ns();
            sample_ns += m - c;
            write_ns += w - m;
            n_agent += 1;
            // The agent's bytes per tick so far (its temporary file under system/), for the
            // floor's write.
            let written: u64 = std::fs::read_dir(dir.path().join("system"))?
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum();
            bytes = (written / n_agent) as usize;
            line.resize(bytes.max(64), b'x');
        }
    }
    let us = |ns: u64, n: u64| ns as f64 / 1e3 / n.max(1) as f64;
    println!("{} files kept open: {}", paths.len(), paths.join(", "));
    println!("{ticks} ticks paced at {} ms, alternating; thread CPU µs per tick:", TICK.as_millis());
    println!("  floor (re-read the files, one write)      {:>8.1}", us(floor_ns, n_floor));
    println!("    of which the write                      {:>8.1}", us(floor_write_ns, n_floor));
    println!("  agent: samplers (re-read and parse)       {:>8.1}", us(sample_ns, n_agent + n_sink));
    println!("  agent: write_tick (format, one write)     {:>8.1}", us(write_ns, n_agent));
    println!("  agent: the same through the Sink seam     {:>8.1}", us(sink_ns, n_sink));
    let agent = us(sample_ns, n_agent + n_sink) + us(write_ns, n_agent);
    println!("  agent: all (samplers, write_tick)         {agent:>8.1}");
    println!("  agent ÷ floor                             {:>8.2}×", agent / us(floor_ns, n_floor));
    Ok(())
}
