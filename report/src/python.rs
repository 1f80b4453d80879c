//! Python-profiling windows: the top functions of a cProfile (`pstats` marshal data) or a
//! pyinstrument (JSON frame tree) window.

use std::collections::HashMap;

use serde::Deserialize;

use crate::model::PyFunction;

/// Functions listed per window.
pub const TOP: usize = 20;

/// The top functions of a cProfile window, by total (cumulative) time.
pub fn cprofile(bytes: &[u8]) -> Result<Vec<PyFunction>, String> {
    let rows = crate::marshal::pstats(bytes).map_err(|e| e.to_string())?;
    let mut out: Vec<PyFunction> = rows
        .into_iter()
        .map(|r| PyFunction {
            name: r.function,
            file: r.file,
            line: Some(r.line),
            calls: Some(r.calls),
            self_s: r.self_s,
            total_s: r.total_s,
        })
        .collect();
    top(&mut out);
    Ok(out)
}

fn top(v: &mut Vec<PyFunction>) {
    v.sort_by(|a, b| b.total_s.total_cmp(&a.total_s).then_with(|| a.name.cmp(&b.name)));
    v.truncate(TOP);
}

#[derive(Debug, Deserialize)]
struct Frame {
    #[serde(default)]
    function: String,
    #[serde(default)]
    file_path_short: Option<String>,
    #[serde(default)]
    file_path: Option<String>,
    #[serde(default)]
    line_no: Option<i64>,
    #[serde(default)]
    time: f64,
    #[serde(default)]
    children: Vec<Frame>,
}

#[derive(Debug, Deserialize)]
struct Session {
    root_frame: Option<Frame>,
}

/// The top functions of a pyinstrument window: per (function, file, line), total = the
/// time of its frames (not counted twice under recursion), self = total − its children's.
pub fn pyinstrument(bytes: &[u8]) -> Result<Vec<PyFunction>, String> {
    let s: Session = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let Some(root) = s.root_frame else { return Ok(Vec::new()) };
    let mut acc: HashMap<(String, String, Option<i64>), (f64, f64)> = HashMap::new();
    let mut on_stack: Vec<(String, String, Option<i64>)> = Vec::new();
    walk(&root, &mut acc, &mut on_stack, 0);
    let mut out: Vec<PyFunction> = acc
        .into_iter()
        .map(|((name, file, line), (total, selft))| PyFunction {
            name,
            file,
            line,
            calls: None,
            self_s: selft,
            total_s: total,
        })
        .collect();
    top(&mut out);
    Ok(out)
}

fn walk(
    f: &Frame,
    acc: &mut HashMap<(String, String, Option<i64>), (f64, f64)>,
    stack: &mut Vec<(String, String, Option<i64>)>,
    depth: usize,
) {
    if depth > 512 {
        return;
    }
    let file = f.file_path_short.clone().or_else(|| f.file_path.clone()).unwrap_or_default();
    let key = (f.function.clone(), file, f.line_no);
    let children: f64 = f.children.iter().map(|c| c.time).sum();
    let e = acc.entry(key.clone()).or_insert((0.0, 0.0));
    if !stack.contains(&key) {
        e.0 += f.time;
    }
    e.1 += (f.time - children).max(0.0);
    stack.push(key);
    for c in &f.children {
        walk(c, acc, stack, depth + 1);
    }
    stack.pop();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pyinstrument_self_and_total() {
        let j = br#"{"root_frame": {"function": "<module>", "file_path_short": "train.py", "line_no": 1, "time": 3.0,
            "children": [{"function": "step", "file_path_short": "train.py", "line_no": 5, "time": 2.0,
               "children": [{"function": "step", "file_path_short": "train.py", "line_no": 5, "time": 1.5, "children": []}]}]}}"#;
        let f = pyinstrument(j).unwrap();
        assert_eq!(f[0].name, "<module>");
        assert_eq!((f[0].total_s, f[0].self_s), (3.0, 1.0));
        let step = f.iter().find(|x| x.name == "step").unwrap();
        assert_eq!((step.total_s, step.self_s, step.calls), (2.0, 2.0, None));
        assert!(pyinstrument(br#"{"root_frame": null}"#).unwrap().is_empty());
    }
}
