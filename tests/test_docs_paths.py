"""The documents name only what exists: every repository path written in backticks in
README.md, ARCHITECTURE.md, docs/*.md and docker/README.md (one that starts with a top-level
folder of the repository, such as `agent/src/pipeline/sink.rs` or `docs/formats.md`), and
every relative Markdown link (`[formats](formats.md#timeline-files)`): its file, and for a
link into a Markdown file its `#anchor`, a heading there as GitHub names it.

A path may carry a `:line` suffix or an `#anchor` (left out), `{a,b}` alternatives (each
must exist) and `<placeholder>` or `*` parts (something must match). Fenced code blocks are
commands and output, not references, and are left out. BENCHMARKS.md is a dated log: it
names files where they were when it was measured, so it is not checked.

The code cites the documents the same way: every `docs/x.md, "Section"` (or
`ARCHITECTURE.md, "Section"`, `BENCHMARKS.md, "…"`) in a comment or docstring of the
source, tests, benches and scripts must name a file that exists and a section of it: a
heading, a bold lead (`**Section.**`), or a line that ends in a colon, that contains the
cited words (case and backticks aside)."""

import pathlib
import re
import unicodedata

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: The top-level folders a path is recognised by; a folder added to the repository counts
#: too (`top_folders`), and one removed from it makes every path into it fail.
FOLDERS = (
    "agent", "report", "output", "hook-ffi", "config", "scripts", "tests", "bench", "docs",
    "build-backend", "vendor", "examples", "docker",
)

SKIP_DIRS = {"target", "node_modules"}


def documents(root: pathlib.Path) -> list[pathlib.Path]:
    docs = [root / "README.md", root / "ARCHITECTURE.md", *sorted((root / "docs").glob("*.md"))]
    docs.append(root / "docker" / "README.md")
    return [d for d in docs if d.is_file()]


def top_folders(root: pathlib.Path) -> set[str]:
    found = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
    return (found - SKIP_DIRS) | set(FOLDERS)


def prose(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with their numbers."""
    out, fence = [], None
    for no, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * len(m.group(1))
            elif m.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            out.append((no, line))
    return out


def code_spans(line: str) -> list[str]:
    """The inline code spans of a line (`x`, ``x``)."""
    return [m.group(2) for m in re.finditer(r"(`+)(.+?)\1", line)]


def expand(path: str) -> list[str]:
    """`a/{b,c}.rs` → `a/b.rs`, `a/c.rs` (nested alternatives too)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",") for x in expand(path[: m.start()] + alt + path[m.end() :])]


def repo_paths(span: str, folders: set[str]) -> list[str]:
    """The repository paths named in one code span (a span may be a command line)."""
    out = []
    for token in re.findall(r"(?:<[^>]*>|[^\s<])+", span):
        token = token.strip("'\"()[],;").split("#", 1)[0]
        token = re.sub(r":\d+(-\d+)?$", "", token)
        token = token.removeprefix("./")
        head = token.split("/", 1)[0]
        if "/" in token and head in folders and "=" not in head:
            out.append(token)
    return out


def exists(root: pathlib.Path, path: str) -> bool:
    for p in expand(path):
        pattern = re.sub(r"<[^>]*>", "*", p).rstrip("/")
        if any(c in pattern for c in "*?["):
            if not any(root.glob(pattern)):
                return False
        elif not (root / pattern).exists():
            return False
    return True


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case; letters, marks, numbers, `_`, `-` and
    spaces kept, the spaces made `-`; the rest (backticks, punctuation) dropped."""
    kept = []
    for c in heading.strip().lower():
        cat = unicodedata.category(c)
        if cat[0] in "LMN" or cat == "Pc" or c in " -":
            kept.append(c)
    return "".join(kept).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose(path.read_text(encoding="utf-8")):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def problems(root: pathlib.Path) -> list[str]:
    """Every stale path and link in the documents, as `file:line: what`."""
    folders = top_folders(root)
    out = []
    for doc in documents(root):
        rel = doc.relative_to(root)
        for no, line in prose(doc.read_text(encoding="utf-8")):
            for span in code_spans(line):
                for p in repo_paths(span, folders):
                    if not exists(root, p):
                        out.append(f"{rel}:{no}: `{p}` does not exist")
            for target in LINK.findall(re.sub(r"(`+).+?\1", "", line)):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue  # https:, mailto:: not the repository's
                file, _, anchor = target.partition("#")
                dest = (doc.parent / file).resolve() if file else doc
                if not dest.exists():
                    out.append(f"{rel}:{no}: link ({target}): {file} does not exist")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    out.append(f"{rel}:{no}: link ({target}): no heading #{anchor} in {file or rel.name}")
    return out


def test_every_path_and_link_in_the_documents_exists():
    found = problems(ROOT)
    assert not found, "stale references in the documents:\n" + "\n".join(found)


def test_the_check_finds_what_it_should(tmp_path):
    """A planted bad path, link and anchor each fail; good ones of every shape pass."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "agent" / "src").mkdir(parents=True)
    for f in ("lib.rs", "cpu.rs", "net.rs"):
        (tmp_path / "agent" / "src" / f).write_text("")
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## The `x` part (y)\n\n## Title\n")
    (tmp_path / "README.md").write_text(
        "`agent/src/lib.rs:12` `agent/src/{cpu,net}.rs` `agent/src/<name>.rs` `agent/`\n"
        "`cargo run agent/src/lib.rs#L3` [a](docs/a.md#the-x-part-y) [b](docs/a.md#title-1)\n"
        "[web](https://example.com/nope.md)\n"
        "```\nagent/src/fenced.rs `agent/src/fenced.rs`\n```\n"
        "`agent/src/gone.rs` `agent/src/{cpu,disk}.rs` [c](docs/b.md) [d](docs/a.md#nope)\n"
        "`report/src/x.rs:4`\n"
    )
    (tmp_path / "ARCHITECTURE.md").write_text("")
    found = problems(tmp_path)
    assert found == [
        "README.md:7: `agent/src/gone.rs` does not exist",
        "README.md:7: `agent/src/{cpu,disk}.rs` does not exist",
        "README.md:7: link (docs/b.md): docs/b.md does not exist",
        "README.md:7: link (docs/a.md#nope): no heading #nope in docs/a.md",
        "README.md:8: `report/src/x.rs` does not exist",
    ], found


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("Native CPU sampling (`NativeProfilingConfig`)", "native-cpu-sampling-nativeprofilingconfig"),
        ("Differences from smdebug 1.0.34 (each one tested)", "differences-from-smdebug-1034-each-one-tested"),
        ("At the end of `trainprof run`", "at-the-end-of-trainprof-run"),
        ("`trainprof agent` and `trainprof run -- CMD…`", "trainprof-agent-and-trainprof-run----cmd"),
    ],
)
def test_anchors_are_githubs(heading, anchor):
    assert slug(heading) == anchor


#: Files of code whose comments may cite a document; build output and vendored code aside.
CODE_SUFFIXES = {".rs", ".py", ".c", ".h", ".js", ".sh", ".toml", ".ini"}
CODE_SKIP = SKIP_DIRS | {"vendor", ".venv", ".git", "node_modules", "__pycache__"}
#: A comment line's marker, taken off before lines are joined, so that a citation broken over
#: two comment lines is still one citation.
COMMENT_MARK = re.compile(r"^\s*(?://[!/]?|#|\*|/\*+|\"\"\")?\s?")
CITATION = re.compile(
    r"((?:docs/)?[A-Za-z][A-Za-z-]*\.md)`?\)?,?\s*(?:section\s*)?[\"“]([^\"”(){}=\[\]\n]{1,80})[\"”]"
)


def code_files(root: pathlib.Path) -> list[pathlib.Path]:
    out = []
    for p in sorted(root.rglob("*")):
        parts = p.relative_to(root).parts
        if any(part in CODE_SKIP or part.startswith(".") for part in parts[:-1]):
            continue
        if p.is_file() and (p.suffix in CODE_SUFFIXES or parts[0] == "scripts" and p.suffix == ""):
            out.append(p)
    return out


def sections(doc: pathlib.Path) -> list[str]:
    """What a citation may name in `doc`: headings, bold leads, lines ending in a colon."""
    out = []
    for _, line in prose(doc.read_text(encoding="utf-8")):
        for pattern in (r"#{1,6}\s+(.*)", r"\s*(?:[*-]\s+|\|\s*)?\*\*(.+?)\*\*", r"([A-Z][^.:]{0,60}):\s*$"):
            m = re.match(pattern, line)
            if m:
                out.append(m.group(1).replace("`", "").strip().rstrip(".:").lower())
    return out


def citations(root: pathlib.Path, files: list[pathlib.Path]) -> list[tuple[str, str, str]]:
    """Every `(file, document, section)` cited in `files`."""
    out = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        joined = " ".join(COMMENT_MARK.sub("", line, count=1) for line in text.splitlines())
        for m in CITATION.finditer(joined):
            out.append((str(f.relative_to(root)), m.group(1), m.group(2).replace("`", "").strip()))
    return out


def citation_problems(root: pathlib.Path, files: list[pathlib.Path]) -> list[str]:
    """Every citation of a missing document or section, as `file: what`."""
    out = []
    cache: dict[pathlib.Path, list[str]] = {}
    for rel, doc, section in citations(root, files):
        path = root / doc if "/" in doc or (root / doc).exists() else root / "docs" / doc
        if not path.is_file():
            out.append(f'{rel}: {doc}, "{section}": no such document')
            continue
        if path not in cache:
            cache[path] = sections(path)
        if not any(section.lower() in s for s in cache[path]):
            out.append(f'{rel}: {doc}, "{section}": no such section')
    return out


def test_every_citation_in_the_code_names_a_section():
    here = pathlib.Path(__file__).resolve()
    files = [f for f in code_files(ROOT) if f != here]  # this file plants bad ones below
    problems = citation_problems(ROOT, files)
    assert not problems, "\n".join(problems)
    # The check saw the citations there are (a pattern that matched none would pass).
    assert len(citations(ROOT, files)) > 250


def test_the_citation_check_finds_what_it_should(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# Title\n\n## `trainprof compare`\n\n* **Nothing is replaced.** Text.\n\nBehaviour to know:\n\n"
        "```\n## not a heading\n```\n"
    )
    (tmp_path / "ARCHITECTURE.md").write_text("# A\n\n### The sink seam\n")
    src = tmp_path / "x.rs"
    src.write_text(
        '//! Good: (`docs/a.md`, "compare"), docs/a.md, "Nothing is replaced", (docs/a.md,\n'
        '//! "Behaviour to know"), ARCHITECTURE.md, "The sink seam".\n'
        '/// Bad: (`docs/a.md`, "Sparse\n'
        '/// files"), docs/b.md, "Title", ARCHITECTURE.md, "not a heading".\n'
    )
    assert citation_problems(tmp_path, [src]) == [
        'x.rs: docs/a.md, "Sparse files": no such section',
        'x.rs: docs/b.md, "Title": no such document',
        'x.rs: ARCHITECTURE.md, "not a heading": no such section',
    ]
