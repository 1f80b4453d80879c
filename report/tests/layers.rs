//! The crate's layers (ARCHITECTURE.md, "The report crate"; `src/lib.rs` is the map): a
//! module names only its own layer or the ones below it, outside its tests. The model, at the
//! bottom, names nothing of the crate but itself. Within a folder, the files' names of each
//! other make no circle either (`rules/`: `mod.rs` → the rule files → `rule.rs`).

use std::path::Path;

/// Bottom first; the outputs share the top.
const LAYERS: &[&[&str]] =
    &[&["model"], &["reading"], &["analysis"], &["rules"], &["job"], &["page", "trace", "compare"]];

fn layer(top: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&top))
}

/// A file's code: its lines without its comment lines and its `#[cfg(test)]` module (at the
/// end of the file).
fn code(src: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut lines = src.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t == "#[cfg(test)]" && lines.peek().is_some_and(|n| n.trim_start().contains("mod tests")) {
            break;
        }
        if !t.starts_with("//") {
            out.push(line);
        }
    }
    out
}

/// The crate paths (`crate::<module>`) a file's code names.
fn named(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in code(src) {
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

fn ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths written at `at` of `s` (`a::b`, `a::{b, c::d}`, `*`), each as its segments.
fn paths(s: &[char], mut at: usize) -> Vec<Vec<String>> {
    while s.get(at).is_some_and(|c| c.is_whitespace()) {
        at += 1;
    }
    if s.get(at) == Some(&'{') {
        // A group: its items, split at the commas outside nested groups.
        let (mut depth, mut out, mut start) = (0, Vec::new(), at + 1);
        for (i, c) in s.iter().enumerate().skip(at) {
            match c {
                '{' => depth += 1,
                '}' | ',' if depth == 1 => {
                    out.extend(paths(s, start));
                    start = i + 1;
                    if *c == '}' {
                        return out;
                    }
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        return out;
    }
    let end = (at..s.len()).find(|&i| !(ident(s[i]) || s[i] == '*')).unwrap_or(s.len());
    if end == at {
        return Vec::new();
    }
    let seg: String = s[at..end].iter().collect();
    if s.get(end) == Some(&':') && s.get(end + 1) == Some(&':') {
        let mut out = paths(s, end + 2);
        for p in &mut out {
            p.insert(0, seg.clone());
        }
        if !out.is_empty() {
            return out;
        }
    }
    vec![vec![seg]]
}

/// The files of `dir` (a module's folder: `mod.rs` and its modules' files, by their stems) that
/// each file's code names: `crate::<dir>::…`, `super::…` in a module's file and, in `mod.rs`, a
/// module's name or `self::…`. A name that is no module's file is `mod.rs`'s.
fn edges(
    dir: &Path,
) -> std::io::Result<std::collections::BTreeMap<String, std::collections::BTreeSet<String>>> {
    let folder = dir.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let mut stems = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "rs") {
            stems.insert(p.file_stem().unwrap_or_default().to_string_lossy().into_owned());
        }
    }
    let mut out = std::collections::BTreeMap::new();
    for own in &stems {
        let src = std::fs::read_to_string(dir.join(format!("{own}.rs")))?;
        // Each character with the number of inline modules (`mod x {`) it is in: rustfmt closes
        // one with a `}` at the indentation of its `mod`.
        let (mut text, mut depth, mut open) = (Vec::new(), Vec::new(), Vec::<usize>::new());
        for line in code(&src) {
            let indent = line.len() - line.trim_start().len();
            let t = line.trim_start().trim_start_matches("pub ").trim_start_matches("pub(crate) ");
            if t.starts_with("mod ") && t.ends_with('{') {
                open.push(indent);
            } else if t == "}" && open.last() == Some(&indent) {
                open.pop();
            }
            for c in line.chars().chain(['\n']) {
                text.push(c);
                depth.push(open.len());
            }
        }
        let to =
            |seg: &str| if stems.contains(seg) && seg != "mod" { seg.to_owned() } else { "mod".to_owned() };
        let mut named = std::collections::BTreeSet::new();
        for i in 0..text.len() {
            if i > 0 && (ident(text[i - 1]) || (i > 1 && text[i - 1] == ':' && text[i - 2] == ':')) {
                continue;
            }
            let word_end = (i..text.len()).find(|&k| !ident(text[k])).unwrap_or(text.len());
            let word: String = text[i..word_end].iter().collect();
            if word.is_empty() {
                continue;
            }
            // The module a path starts from, counted from the folder's (0): the file's own, then
            // one up for each `super`.
            let level = usize::from(own != "mod") + depth[i];
            for p in paths(&text, i) {
                let supers = p.iter().take_while(|s| *s == "super").count();
                let target = match p.first().map(String::as_str) {
                    Some("crate") if p.len() > 1 && p[1] == folder => {
                        Some(to(p.get(2).map_or("mod", String::as_str)))
                    }
                    Some("super") if supers == level && p.len() > supers => Some(to(&p[supers])),
                    Some("self") if level == 0 && p.len() > 1 => Some(to(&p[1])),
                    Some(m) if level == 0 && p.len() > 1 && m != "mod" && stems.contains(m) => {
                        Some(m.to_owned())
                    }
                    _ => None,
                };
                if let Some(t) = target.filter(|t| t != own) {
                    named.insert(t);
                }
            }
        }
        out.insert(own.clone(), named);
    }
    Ok(out)
}

/// The circles of names between the files of each folder of `src`, as `folder: a -> b -> a`.
fn circles(src: &Path) -> std::io::Result<Vec<String>> {
    let mut dirs: Vec<_> =
        std::fs::read_dir(src)?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()).collect();
    dirs.sort();
    let mut bad = Vec::new();
    for dir in dirs {
        let g = edges(&dir)?;
        let name = dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
        // A path from a file back to itself, found depth first from each file in turn.
        fn back(
            g: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
            path: &mut Vec<String>,
        ) -> bool {
            let Some(last) = path.last().cloned() else { return false };
            for next in g.get(&last).into_iter().flatten() {
                if *next == path[0] {
                    path.push(next.clone());
                    return true;
                }
                if !path.contains(next) && next > &path[0] {
                    path.push(next.clone());
                    if back(g, path) {
                        return true;
                    }
                    path.pop();
                }
            }
            false
        }
        for start in g.keys() {
            let mut path = vec![start.clone()];
            if back(&g, &mut path) {
                bad.push(format!("{name}: {}", path.join(" -> ")));
            }
        }
    }
    Ok(bad)
}

#[test]
fn no_circle_of_names_between_the_files_of_a_folder() {
    let bad = circles(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).unwrap();
    assert!(bad.is_empty(), "files of a folder naming each other in a circle:\n{}", bad.join("\n"));
}

#[test]
fn the_check_sees_a_circle() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    let write = |f: &str, s: &str| std::fs::write(rules.join(f), s).unwrap();
    write(
        "mod.rs",
        "pub mod a;\npub mod rule;\nregistry! { A(a): a::A }\npub type Agg = collect::Agg<NodeRules>;\n",
    );
    write("rule.rs", "// super::Agg in a comment is no name\npub trait Rule {}\n");
    write(
        "a.rs",
        "use super::rule::Rule;\npub struct A;\n#[cfg(test)]\nmod tests {\n    use super::super::Agg;\n}\n",
    );
    assert_eq!(circles(dir.path()).unwrap(), Vec::<String>::new());
    // The rule file names `mod.rs` (its `Agg`), which names the rule file.
    write("a.rs", "use super::{Agg, rule::Rule};\npub struct A;\n");
    assert_eq!(circles(dir.path()).unwrap(), ["rules: a -> mod -> a"]);
    write("a.rs", "use crate::rules::Agg;\npub struct A;\n");
    assert_eq!(circles(dir.path()).unwrap(), ["rules: a -> mod -> a"]);
    // Two rule files naming each other.
    write("a.rs", "pub struct A(super::rule::B);\n");
    write("rule.rs", "pub struct B;\nimpl B { fn f() -> crate::rules::a::A { todo!() } }\n");
    assert_eq!(circles(dir.path()).unwrap(), ["rules: a -> rule -> a"]);
}
