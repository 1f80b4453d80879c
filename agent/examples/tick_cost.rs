//! Benchmark (not a test): the sampling loop's CPU per tick, measured inside the process
//! with `CLOCK_THREAD_CPUTIME_ID` around each sampler's `sample` (user + system, the loop's
//! own thread). Results and the command go to BENCHMARKS.md.
//!
//! 1. As cores grow: the CPU sampler on a fake `/proc/stat` of 2 … 192 cores, with an
//!    `intr` line that grows with them (the counters advance between ticks, outside the
//!    measurement).
//! 2. Every sampler of this machine (`probe_samplers` on the real roots), per sampler,
//!    around two trainer trees: `sh` with three `sleep`s, and a Python parent with a
//!    512 MiB shared region and four forked children that touch it (PSS reads walk it).
//!    Time passes 100 ms per tick without sleeping, so the paced readers (PSS, clock)
//!    run as often as they would at 100 ms.
//!
//!     cargo run --release -p trainprof-agent --example tick_cost [TICKS]

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use trainprof_agent::pipeline::sample::cpu::CpuSampler;
use trainprof_agent::pipeline::sample::probe::{ProbeContext, probe_samplers};
use trainprof_agent::pipeline::sample::tree_pids::TreePids;
use trainprof_agent::pipeline::sample::{Metrics, Roots, Sampler};

use trainprof_agent::pipeline::sample::process::thread_cpu_ns;

const TICK: Duration = Duration::from_millis(100);

fn proc_stat(cores: usize, k: u64) -> String {
    let mut s = String::new();
    let line = |label: &str, i: u64| {
        format!(
            "{label} {} 0 {} {} {} 0 {} 0 0 0\n",
            1000 + k * 7 + i,
            500 + k * 3,
            90_000 + k * 13,
            10 + k,
            3
        )
    };
    s += &line("cpu", 0);
    for c in 0..cores {
        s += &line(&format!("cpu{c}"), c as u64); // not the protocol: /proc/stat's line
    }
    // One counter per interrupt number, most of them 0: 256 + 8 per core here (this VM's
    // has 424 on 2 cores; large hosts have thousands).
    s += "intr 123456";
    for i in 0..256 + 8 * cores {
        s += if i % 50 == 0 { " 98765" } else { " 0" };
    }
    s += "\nctxt 456\nbtime 1700000000\nprocesses 789\nprocs_running 2\nprocs_blocked 0\n";
    s
}

fn cores_table(ticks: u64) -> Result<(), Box<dyn std::error::Error>> {
    println!("CPU sampler on a fake /proc/stat, {ticks} ticks each:");
    println!("{:>6} {:>12} {:>10}", "cores", "µs per tick", "% of core at 100 ms");
    for cores in [2usize, 8, 32, 96, 192] {
        let dir = tempfile::tempdir()?;
        let proc = dir.path().join("proc");
        std::fs::create_dir_all(&proc)?;
        std::fs::write(proc.join("stat"), proc_stat(cores, 0))?;
        let mut s = CpuSampler::probe(&proc)?;
        let mut m = Metrics::new();
        let mut ns = 0;
        for k in 1..=ticks {
            std::fs::write(proc.join("stat"), proc_stat(cores, k))?;
            m.clear();
            let t0 = thread_cpu_ns();
            s.sample(TICK * k as u32, &mut m)?;
            ns += thread_cpu_ns() - t0;
        }
        assert_eq!(m.len(), 2 * cores + 2);
        let us = ns as f64 / 1e3 / ticks as f64;
        // µs per 100 ms tick as a share of one core: µs / 100,000 µs × 100.
        println!("{cores:>6} {us:>12.1} {:>10.3}", us / 1000.0);
    }
    Ok(())
}

fn per_sampler(label: &str, trainer: &Child, ticks: u64) {
    let roots = Roots::host();
    let start = Instant::now();
    let base = Duration::from_secs(1);
    let now = move || base + start.elapsed();
    let cx = ProbeContext {
        roots: &roots,
        now: &now,
        trainer: Some(trainer.id()),
        nvml_lib: None,
        tree: TreePids::default(),
    };
    let mut p = probe_samplers(&cx);
    let mut m = Metrics::new();
    let mut cost = vec![0u64; p.samplers.len()];
    let mut rows = 0;
    let t0 = now();
    for k in 1..=ticks {
        let at = t0 + TICK * k as u32;
        m.clear();
        for (i, s) in p.samplers.iter_mut().enumerate() {
            let c = thread_cpu_ns();
            let _ = s.sample(at, &mut m);
            cost[i] += thread_cpu_ns() - c;
        }
        rows += m.len();
    }
    let total: u64 = cost.iter().sum();
    println!(
        "{label}: {ticks} ticks, {:.0} rows per tick; µs per tick by sampler:",
        rows as f64 / ticks as f64
    );
    for (s, c) in p.samplers.iter().zip(&cost) {
        println!("  {:<10} {:>8.1}", s.name(), *c as f64 / 1e3 / ticks as f64);
    }
    println!(
        "  {:<10} {:>8.1}  ({:.3} % of one core at 100 ms)",
        "all",
        total as f64 / 1e3 / ticks as f64,
        total as f64 / 1e9 / (ticks as f64 * 0.1) * 100.0
    );
}

const SHARED: &str = r#"
import mmap, os, time
SIZE = 512 << 20
m = mmap.mmap(-1, SIZE)
for i in range(0, SIZE, 4096):
    m[i] = 1
for _ in range(4):
    if os.fork() == 0:
        s = 0
        for i in range(0, SIZE, 4096):
            s += m[i]
        time.sleep(600)
        os._exit(0)
time.sleep(600)
"#;

fn kill_tree(mut child: Child) {
    // The tree's own process group (set below): the children go with it.
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.wait();
}

fn spawn(cmd: &mut Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt as _;
    cmd.process_group(0).spawn()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ticks: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(600);
    cores_table(ticks.max(1000))?;
    println!();
    let small = spawn(Command::new("sh").args(["-c", "sleep 600 & sleep 600 & sleep 600 & wait"]))?;
    std::thread::sleep(Duration::from_millis(300));
    per_sampler("tree: sh + 3 sleeps", &small, ticks);
    kill_tree(small);
    println!();
    let big = spawn(Command::new("python3").args(["-c", SHARED]))?;
    std::thread::sleep(Duration::from_secs(4));
    per_sampler("tree: python, 512 MiB shared, 4 forked children", &big, ticks);
    kill_tree(big);
    Ok(())
}
