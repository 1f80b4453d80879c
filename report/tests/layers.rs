//! The crate's layers (ARCHITECTURE.md, "The report crate"; `src/lib.rs` is the map): a
//! module names only its own layer or the ones below it, outside its tests. The model, at the
//! bottom, names nothing of the crate but itself.

use std::path::Path;

/// Bottom first; the outputs share the top.
const LAYERS: &[&[&str]] =
    &[&["model"], &["reading"], &["analysis"], &["rules"], &["job"], &["page", "trace", "compare"]];

fn layer(top: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&top))
}

/// The crate paths (`crate::<module>`) a file's code names, without its comments and its
/// `#[cfg(test)]` module (at the end of the file).
fn named(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = src.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t == "#[cfg(test)]" && lines.peek().is_some_and(|n| n.trim_start().contains("mod tests")) {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        for (i, _) in line.match_indices("crate::") {
            let before = line[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &line[i + "crate::".len()..];
            let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
            out.push(rest[..end].to_owned());
        }
    }
    out
}

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            files(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// The names of `src` that run up a layer, as `file -> crate::module`.
fn upward(src: &Path) -> std::io::Result<Vec<String>> {
    let mut all = Vec::new();
    files(src, &mut all)?;
    all.sort();
    let mut bad = Vec::new();
    for f in all {
        let rel = f.strip_prefix(src).unwrap_or(&f).to_string_lossy().replace('\\', "/");
        let top = rel.split('/').next().unwrap_or_default().trim_end_matches(".rs");
        let Some(own) = layer(top) else {
            assert_eq!(rel, "lib.rs", "{rel} is in no layer: add it to LAYERS");
            continue;
        };
        for m in named(&std::fs::read_to_string(&f)?) {
            // `$crate::` in a macro, and the crate's root (`crate::to_json`) are no layer.
            if layer(&m).is_some_and(|l| l > own) {
                bad.push(format!("{rel} -> crate::{m}"));
            }
        }
    }
    Ok(bad)
}

#[test]
fn no_module_names_a_layer_above_its_own() {
    let bad = upward(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).unwrap();
    assert!(bad.is_empty(), "names running up a layer:\n{}", bad.join("\n"));
}

#[test]
fn the_check_sees_a_name_running_up() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("model")).unwrap();
    std::fs::write(dir.path().join("lib.rs"), "pub mod model;\n").unwrap();
    std::fs::write(
        dir.path().join("model/mod.rs"),
        "// crate::page in a comment is no name\npub use crate::rules::Evidence;\n\
         #[cfg(test)]\nmod tests {\n    use crate::page;\n}\n",
    )
    .unwrap();
    assert_eq!(upward(dir.path()).unwrap(), ["model/mod.rs -> crate::rules"]);
}
