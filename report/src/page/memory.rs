//! The page's "Memory" section (docs/report.md, "Memory"): per snapshot and device the peaks,
//! the fragmentation, a chart of allocated memory over the history (inline SVG, drawn without
//! JavaScript), the leak finding and the frames holding memory at the peak. Every string is the
//! trainer's and is HTML-escaped.

use std::fmt::Write as _;

use crate::model::memory::{Memory, MemorySnapshot, MemoryWindow, SiteRow, SnapshotDevice};
use crate::page::markup::{esc, utc};

const W: f64 = 720.0;
const H: f64 = 160.0;

fn mib(b: i64) -> String {
    format!("{:.1} MiB", b as f64 / 1048576.0)
}

/// The section; nothing without snapshots.
pub fn section(out: &mut String, m: &Memory) {
    if m.is_empty() {
        return;
    }
    out.push_str("<section id=\"memory-snapshots\"><h2>Memory</h2>\n");
    windows(out, &m.windows);
    if m.snapshots.is_empty() {
        out.push_str("</section>\n");
        return;
    }
    out.push_str(
        "<p class=\"note\">From PyTorch's memory snapshots (the caching allocator's history with Python stacks). \
         A snapshot sees only memory of the caching allocator: not NCCL's buffers, the CUDA context, \
         cuBLAS/cuDNN workspaces allocated outside it, or other processes; the agent's per-process GPU memory \
         (the system metrics' <code>TrainerMemUsedBytes</code>, in the System section) is the whole process's. \
         Each file opens as it is in <a href=\"https://pytorch.org/memory_viz\">pytorch.org/memory_viz</a>.</p>\n",
    );
    for s in &m.snapshots {
        snapshot(out, s);
    }
    out.push_str("</section>\n");
}

/// The detailed windows' memory events: per node, device and window, the peak and a chart.
fn windows(out: &mut String, ws: &[MemoryWindow]) {
    if ws.is_empty() {
        return;
    }
    out.push_str(
        "<h3>Over the detailed windows</h3>\n<p class=\"note\">From torch.profiler's memory events \
         (<code>profile_memory</code>): the allocator's total after each allocation and free. On the CPU \
         torch counts only what was allocated while it recorded.</p>\n\
         <table class=\"memory-windows\"><tr><th>node</th><th>device</th><th>steps</th><th>peak allocated</th>\
         <th>at</th><th>in step</th><th>peak reserved</th><th>allocated at the first / last event</th><th>events</th></tr>\n",
    );
    for w in ws {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}–{}</td><td class=\"peak\">{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{} / {}</td><td>{}</td></tr>",
            esc(&w.node),
            esc(&w.device),
            w.first_step,
            w.last_step,
            mib(w.peak_allocated_bytes),
            utc(Some(w.peak_s)),
            w.peak_step,
            mib(w.peak_reserved_bytes),
            mib(w.first_allocated_bytes),
            mib(w.last_allocated_bytes),
            w.events
        );
    }
    out.push_str("</table>\n");
    for w in ws {
        let label = format!("{} {}, steps {}–{}", w.node, w.device, w.first_step, w.last_step);
        chart_of(out, &w.chart, &label);
    }
}

fn snapshot(out: &mut String, s: &MemorySnapshot) {
    let what = if s.kind == "oom" {
        format!("at the out-of-memory error of step {}", s.first_step)
    } else {
        format!("memory window, steps {}–{}", s.first_step, s.last_step)
    };
    let _ = writeln!(
        out,
        "<h3>{} — {}</h3>\n<p><code>{}</code> ({} bytes)</p>",
        esc(&s.node),
        esc(&what),
        esc(&s.file),
        s.bytes
    );
    if s.devices.is_empty() {
        out.push_str("<p>The snapshot holds no device.</p>\n");
    }
    for d in &s.devices {
        device(out, d);
    }
}

fn device(out: &mut String, d: &SnapshotDevice) {
    let _ = writeln!(
        out,
        "<table class=\"memory-peaks\"><tr><th>device</th><th>peak allocated</th><th>at</th><th>peak reserved</th>\
         <th>fragmentation at the peak (reserved − allocated)</th><th>allocated / reserved at the snapshot</th>\
         <th>history entries</th></tr>\n<tr><td>{}</td><td class=\"peak\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td>{}</td></tr></table>",
        d.device,
        mib(d.peak_allocated_bytes),
        if d.peak_s.is_some() { utc(d.peak_s) } else { "history start or none".to_owned() },
        mib(d.peak_reserved_bytes),
        mib(d.fragmentation_bytes),
        mib(d.allocated_bytes),
        mib(d.reserved_bytes),
        d.entries
    );
    match &d.agent {
        Some(a) => {
            let _ = writeln!(
                out,
                "<p class=\"memory-outside\">The agent saw {} of GPU memory held by the trainer's processes on {} {} \
                 at {}; the snapshot's allocator reserved {} at its peak: <b>{} outside the caching allocator</b> \
                 (the CUDA context, NCCL's buffers, cuBLAS/cuDNN workspaces, other processes of the trainer on that GPU), \
                 which a snapshot cannot see.</p>",
                mib(a.trainer_bytes),
                esc(&a.node),
                esc(&a.gpu),
                utc(Some(a.at_s)),
                mib(a.reserved_bytes),
                mib(a.outside_bytes)
            );
        }
        None => out.push_str(
            "<p class=\"note\">No reading of the trainer's GPU memory by the agent within 5 s of the peak \
             (<code>trainprof run</code> samples it per GPU with NVML): what lies outside the caching allocator \
             is not known here.</p>\n",
        ),
    }
    if let Some(l) = &d.leak {
        let _ = writeln!(
            out,
            "<p class=\"finding leak\"><b>Memory grows step over step.</b> {}</p>",
            esc(&l.sentence)
        );
        table(out, "What grew (allocated in those steps, still live)", &l.sites);
    }
    chart(out, &d.chart);
    table(out, "Live allocations at the peak, by Python frame", &d.top);
    if d.top_left_out_count > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} more allocations ({}) from other frames.</p>",
            d.top_left_out_count,
            mib(d.top_left_out_bytes)
        );
    }
}

fn table(out: &mut String, title: &str, rows: &[SiteRow]) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "<table class=\"memory-top\"><caption>{}</caption><tr><th>frame</th><th>function</th><th>size</th><th>count</th></tr>",
        esc(title)
    );
    for r in rows {
        let at = if r.line > 0 { format!("{}:{}", r.file, r.line) } else { r.file.clone() };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&at),
            esc(&r.function),
            mib(r.bytes),
            r.count
        );
    }
    out.push_str("</table>\n");
}

/// Allocated memory over the history, as a polyline.
fn chart(out: &mut String, pts: &[[f64; 2]]) {
    chart_of(out, pts, "history")
}

/// Allocated memory over time, as a polyline; `what` names the span (escaped here).
fn chart_of(out: &mut String, pts: &[[f64; 2]], what: &str) {
    if pts.len() < 2 {
        return;
    }
    let (t0, t1) = (pts[0][0], pts[pts.len() - 1][0]);
    let top = pts.iter().map(|p| p[1]).fold(1.0f64, f64::max);
    let span = (t1 - t0).max(1e-6);
    let mut line = String::new();
    for p in pts {
        let x = (p[0] - t0) / span * W;
        let y = H - p[1] / top * H;
        let _ = write!(line, "{x:.1},{y:.1} ");
    }
    let _ = writeln!(
        out,
        "<figure class=\"memory-chart\"><svg viewBox=\"0 0 {W} {H}\" width=\"100%\" height=\"{H}\" role=\"img\" \
         aria-label=\"allocated memory over the {}\"><polyline fill=\"none\" stroke=\"#1f77b4\" points=\"{}\"/></svg>\
         <figcaption>Allocated memory, {:.1} s of {}, top {} (MiB).</figcaption></figure>",
        esc(what),
        line.trim_end(),
        t1 - t0,
        esc(what),
        format_args!("{:.1}", top / 1048576.0)
    );
}
