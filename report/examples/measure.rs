//! Times `trainprof_report::build` and `trainprof_report::trace::write` on a LocalPath, for
//! docs/report.md "Measured" (`cargo run --release -p trainprof-report --example measure -- PATH`;
//! `bench/synth_job.py` writes a synthetic hour). Peak memory: run it
//! under `/usr/bin/time -v`, one part at a time (`report` or `trace` as the second argument).

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: measure PATH [report|trace]");
        std::process::exit(2);
    };
    let part = args.next().unwrap_or_default();
    let root = std::path::Path::new(&path);
    if part != "trace" {
        let t = Instant::now();
        match trainprof_report::build(root, &path, &trainprof_report::Options::default()) {
            Ok(m) => {
                let json = trainprof_report::to_json(&m);
                println!("report: {:.2} s, {} bytes of JSON", t.elapsed().as_secs_f64(), json.len());
            }
            Err(e) => eprintln!("report: {e}"),
        }
    }
    if part != "report" {
        let t = Instant::now();
        match trainprof_report::trace::write(root, std::io::sink(), &trainprof_report::trace::Clip::default())
        {
            Ok(w) => println!(
                "trace: {:.2} s, {} slices, {} counter samples",
                t.elapsed().as_secs_f64(),
                w.slices,
                w.counters
            ),
            Err(e) => eprintln!("trace: {e}"),
        }
    }
}
