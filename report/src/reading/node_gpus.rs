//! Each node's GPU models, from the agent's node records (`system/node/<node>/<µs>.json`,
//! docs/formats.md, "Node record"): what `compare` and the page say about the hardware.
//! Read with bounds, as everything the trainer's user could have written: at most
//! [`MAX_NODES`] records (the newest of each node) of at most [`node_record::MAX_BYTES`] each, [`node_record::MAX_GPUS`]
//! GPUs a record, model names cut and shown printable.

use std::collections::BTreeMap;

use trainprof_output::fs::Dir;
use trainprof_output::protocol::node_record;

use crate::reading::{self, Skipped};

/// Nodes whose record is read at most per job.
pub const MAX_NODES: usize = 4096;

/// What a GPU without a model name is called.
pub const UNKNOWN_MODEL: &str = "(model not given by NVML)";

/// node → model → GPUs, from the newest record of each node (by its name's time). A node
/// whose record lists no GPU maps to an empty map; a node without a record (an agent older
/// than the record, or none) is absent.
/// Also each node's job identity in words (docs/formats.md, "Job identity"): node → key →
/// value, from [`node_record::JobIdentity::summary`] (values printable and cut); a record
/// without one gives none.
pub type Identities = BTreeMap<String, BTreeMap<String, String>>;

pub fn read(dir: &Dir, skipped: &mut Skipped) -> (BTreeMap<String, BTreeMap<String, u32>>, Identities) {
    // system/node/<node>/<µs>.json: the newest name per node folder.
    let newest = reading::newest_per_node(dir, node_record::FOLDER, MAX_NODES, skipped);
    let mut out = BTreeMap::new();
    let mut identities = Identities::new();
    for (node, rel) in newest {
        let bytes = match reading::read_file(dir, &rel, node_record::MAX_BYTES) {
            Ok(b) => b,
            Err(e) => {
                skipped.push(e);
                continue;
            }
        };
        let Some(record) = node_record::parse(&bytes) else {
            skipped.push(format!("{rel}: not a node record"));
            continue;
        };
        let mut models: BTreeMap<String, u32> = BTreeMap::new();
        for g in record.gpus.iter().take(node_record::MAX_GPUS) {
            let model = g.model.as_deref().map_or_else(
                || UNKNOWN_MODEL.to_owned(),
                |m| reading::printable(m.trim(), node_record::MAX_MODEL_BYTES),
            );
            *models.entry(model).or_default() += 1;
        }
        // The folder names the node; the record's own NodeId is not trusted over it.
        let node = reading::printable(&node, node_record::MAX_MODEL_BYTES);
        if let Some(job) = &record.job {
            let gpus = &record.gpus[..record.gpus.len().min(node_record::MAX_GPUS)];
            identities.insert(
                node.clone(),
                job.summary(gpus).into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            );
        }
        out.insert(node, models);
    }
    (out, identities)
}

/// The GPUs of a job in words, over every node: `8 × NVIDIA H200`, models by name and
/// joined by `, `; `no GPU` when the records list none; `None` without a record.
pub fn describe(gpus: &BTreeMap<String, BTreeMap<String, u32>>) -> Option<String> {
    if gpus.is_empty() {
        return None;
    }
    let mut all: BTreeMap<&str, u32> = BTreeMap::new();
    for models in gpus.values() {
        for (m, n) in models {
            *all.entry(m).or_default() += n;
        }
    }
    if all.is_empty() {
        return Some("no GPU".to_owned());
    }
    Some(all.iter().map(|(m, n)| format!("{n} × {m}")).collect::<Vec<_>>().join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(root: &std::path::Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn the_newest_record_of_each_node_bounded_and_printable() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        let gpu = |i: u32, m: &str| format!(r#"{{"Index":{i},"Model":{},"MemoryTotalBytes":1}}"#, m);
        let rec =
            |gpus: Vec<String>| format!(r#"{{"NodeId":"x","Timestamp":1,"Gpus":[{}]}}"#, gpus.join(","));
        put(r, "system/node/algo-1/1795316901000000.json", &rec(vec![gpu(0, "\"Old GPU\"")]));
        put(
            r,
            "system/node/algo-1/1795316902000000.json",
            &rec(vec![gpu(0, "\"NVIDIA H200\""), gpu(1, "\"NVIDIA H200\""), gpu(2, "null")]),
        );
        put(r, "system/node/algo-2/1795316901000000.json", &rec(vec![]));
        put(r, "system/node/algo-3/1795316901000000.json", &rec(vec![gpu(0, "\"A\\u001b[31m\"")]));
        put(r, "system/node/algo-4/1795316901000000.json", "[1,2");
        put(r, "system/node/algo-5/1795316901000000.json", &" ".repeat(100_000));
        put(r, "system/node/algo-6/notes.txt", "not a record");
        let many: Vec<String> = (0..1000).map(|i| gpu(i, "\"M\"")).collect();
        put(r, "system/node/algo-7/1795316901000000.json", &rec(many));
        let dir = Dir::open_root(r, false).unwrap();
        let mut skipped = Skipped::default();
        let (got, _) = read(&dir, &mut skipped);
        let want: BTreeMap<String, BTreeMap<String, u32>> = [
            ("algo-1", vec![("NVIDIA H200", 2), (UNKNOWN_MODEL, 1)]),
            ("algo-2", vec![]),
            ("algo-3", vec![("A\\x1b[31m", 1)]),
            ("algo-7", vec![("M", node_record::MAX_GPUS as u32)]),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v.into_iter().map(|(m, c)| (m.to_owned(), c)).collect()))
        .collect();
        assert_eq!(got, want);
        let said = skipped.0.join("\n");
        assert!(said.contains("algo-4/1795316901000000.json: not a node record"), "{said}");
        assert!(said.contains("algo-5/1795316901000000.json: 100000 bytes"), "{said}");
        assert_eq!(
            describe(&got).unwrap(),
            "1 × (model not given by NVML), 1 × A\\x1b[31m, 64 × M, 2 × NVIDIA H200"
        );
        assert_eq!(describe(&BTreeMap::new()), None);
        assert_eq!(describe(&[("algo-1".to_owned(), BTreeMap::new())].into()).unwrap(), "no GPU");
    }

    /// The page's Job table names each node's GPUs, as text.
    #[test]
    fn the_page_names_each_node_s_gpus() {
        let mut m = crate::model::ReportModel::default();
        let page = crate::page::render(&m);
        assert!(!page.contains("GPUs (node records)"), "no row without a record");
        m.job.gpu_models.insert("algo-1".into(), [("NVIDIA <H200>".to_owned(), 2)].into());
        m.job.gpu_models.insert("algo-2".into(), BTreeMap::new());
        let page = crate::page::render(&m);
        assert!(
            page.contains(
                "<tr><th>GPUs (node records)</th><td>algo-1: 2 × NVIDIA &lt;H200&gt;; algo-2: no GPU</td></tr>"
            ),
            "{}",
            &page[page.find("<section id=\"job\"").unwrap()..][..1500]
        );
    }

    /// `compare`'s `GPU model` item: from the records, `unknown` where a side has none.
    #[test]
    fn compare_names_the_gpu_models_and_sees_them_differ() {
        use crate::compare::{self, ModeRun, Run};
        let run = |gpus: &[(&str, &str, u32)]| {
            let mut model = crate::model::ReportModel::default();
            for (node, m, n) in gpus {
                model.job.gpu_models.entry((*node).to_owned()).or_default().insert((*m).to_owned(), *n);
            }
            let ms = crate::analysis::stats::sorted(
                &(0..100).map(|i| 40.0 + f64::from(i % 10)).collect::<Vec<_>>(),
            );
            let modes = [("TRAIN".to_owned(), ModeRun { ms, ..ModeRun::default() })].into();
            Run { model, modes, node_ticks: BTreeMap::new(), pressure: Vec::new() }
        };
        let item = |a: &Run, b: &Run| {
            let c = compare::compare(a, b, &compare::Options::default());
            let i = c.comparable.items.iter().find(|i| i.what == "GPU model").unwrap().clone();
            (i.a, i.b, i.status, c.comparable.ok)
        };
        let h200 = run(&[("algo-1", "NVIDIA H200", 8)]);
        let h100 = run(&[("algo-1", "NVIDIA H100 80GB HBM3", 4), ("algo-2", "NVIDIA H100 80GB HBM3", 4)]);
        let none = run(&[]);
        let s = |x: &str| x.to_owned();
        assert_eq!(
            item(&h200, &h200),
            (s("8 × NVIDIA H200"), s("8 × NVIDIA H200"), compare::Status::Same, true)
        );
        assert_eq!(
            item(&h200, &h100),
            (s("8 × NVIDIA H200"), s("8 × NVIDIA H100 80GB HBM3"), compare::Status::Differs, false)
        );
        assert_eq!(
            item(&h200, &none),
            (s("8 × NVIDIA H200"), s("not recorded"), compare::Status::Unknown, true)
        );
    }
}
