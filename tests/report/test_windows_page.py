"""The native window and the Python windows in `trainprof report` (docs/report.md, "Native
windows" and "Python windows"), with the real binary.

On the real H200 job (tests/fixtures/h200-resnet50: ResNet-50, one native window whose
flamegraph.svg holds the mangled names of that build, cProfile windows of steps 203–214
(triggered) and 240–242 (configured), the pre-step-zero and post-close windows), the native
window's top frames are there and demangled, the Python windows are named by mode, step range
and profiler, and the top functions are merged over the step windows.

Then hostile native windows (script in the SVG and in the names, a gzip bomb, a file past the
cap, links out of the folder): nothing of them reaches the page as markup, nothing behind a
link is read, and the report's memory stays bounded."""

import gzip
import json
import marshal
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import zlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "h200-resnet50" / "job.tar.gz"
MB = 1 << 20


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("h200")
    with tarfile.open(FIXTURE) as t:
        t.extractall(out, filter="data")
    return out


def report(trainprof_bin, path, *args):
    """(model, stderr) of `trainprof report PATH --json ARGS`."""
    proc = subprocess.run([str(trainprof_bin), "report", str(path), "--json", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def page(trainprof_bin, path, tmp_path, name="page.html"):
    target = tmp_path / name
    proc = subprocess.run([str(trainprof_bin), "report", str(path), "-o", str(target)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return target.read_text()


def section(html, start, end="</section>"):
    i = html.index(start)
    return html[i:html.index(end, i)]


# --- the real job ------------------------------------------------------------------------------


def test_the_native_window_of_the_real_job_is_shown_demangled(trainprof_bin, job, tmp_path):
    m, _ = report(trainprof_bin, job)
    (w,) = m["native"]
    assert (w["node"], w["pid"], w["source"], w["samples"]) == ("743-vm", 743, "flamegraph.svg", 53)
    assert w["window"] == "1795658444075479-1795658444782650_743"
    assert abs(w["end_s"] - w["start_s"] - 0.707171) < 1e-6
    # Read from the SVG: the same counts its titles say.
    assert (w["top_self"][0]["name"], w["top_self"][0]["self_samples"]) == ("cuCtxSynchronize_v2", 10)
    names = [f["name"] for f in w["top_self"] + w["top_total"]] + w["flame"]["names"]
    assert not [n for n in names if n.startswith("_Z")], names
    assert "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, " \
           "torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)" \
           in names
    assert any(n.startswith("at::native::_batch_norm_impl_index(") for n in w["flame"]["names"])
    # Self samples add up to the window's; every frame of the flame graph is drawn (309 in the SVG
    # plus none narrower than 0.1 %).
    assert sum(f["self_samples"] for f in w["top_self"]) <= 53
    assert len(w["flame"]["frames"]) == 309 and w["flame"]["frames"][0] == [0, 0, 0, 53]
    assert w["flame"]["names"][0] == "all"

    html = page(trainprof_bin, job, tmp_path)
    sec = section(html, '<section id="native">')
    assert "_ZN" not in sec
    assert "<td class=\"code\">cuCtxSynchronize_v2</td><td class=\"n\">10</td><td class=\"n\">18.9</td>" in sec
    assert "torch::autograd::Engine::evaluate_function(std::shared_ptr&lt;torch::autograd::GraphTask&gt;&amp;" in sec
    assert sec.count("<g><title>") == 309
    assert '<a href="#native">Native</a>' in html
    # The trainer's SVG is not on the page: only the page's three script elements.
    assert html.count("<script") == 3 and "init(evt)" not in html


def test_python_windows_are_named_and_merged(trainprof_bin, job, tmp_path):
    m, _ = report(trainprof_bin, job)
    groups = m["python_summary"]["windows"]
    assert [(g["label"], g["kind"], g["folders"]) for g in groups] == [
        ("before the first step · cProfile", "before_first_step", 1),
        ("train steps 203–204 · cProfile", "steps", 4),
        ("train steps 206–207 · cProfile", "steps", 4),
        ("train steps 209–210 · cProfile", "steps", 4),
        ("train steps 212–213 · cProfile", "steps", 4),
        ("train steps 240–242 · cProfile", "steps", 6),
        ("after close · cProfile", "after_close", 1),
    ]
    g = groups[5]
    assert (g["mode"], g["first_step"], g["last_step"], g["node"]) == ("train", 240, 242, "743-vm")
    # Every folder says which window it belongs to and which part of it it is.
    folders = {w["window"]: w for w in m["python"]}
    assert len(folders) == 24
    w = folders["train-241-forwardpassend-1795658443408064.3_train-242-stepstart-1795658443434375.3"]
    assert (w["label"], w["part"]) == ("train steps 240–242 · cProfile",
                                       "train step 241 forward pass end → train step 242 start")
    assert folders["prestepzero-*-start-1795658425704352.3_train-0-stepstart-1795658426066506.3"]["part"] == \
        "init → train step 0 start"

    # Merged over the 22 step-window folders: the sums pstats gives over the same files (each
    # stats entry is (primitive calls, calls, self, total, callers)).
    top = m["python_summary"]["top"]
    assert top["folders"] == 22
    step_folders = [w for w in m["python"] if w["label"].startswith("train ")]
    assert len(step_folders) == 22
    spans = sum(w["end_s"] - w["start_s"] for w in step_folders)
    assert abs(top["profiled_s"] - spans) < 1e-6
    merged = {}
    for w in step_folders:
        with open(job / "framework" / "pytorch" / "cprofile" / "743-vm" / w["window"] / "python_stats", "rb") as f:
            stats = marshal.load(f)
        for (file, line, name), (_, nc, tt, ct, _) in stats.items():
            acc = merged.setdefault((name, file, line), [0, 0.0, 0.0, 0])
            acc[0] += nc
            acc[1] += tt
            acc[2] += ct
            acc[3] += 1
    want = sorted(merged.items(), key=lambda kv: (-kv[1][2], kv[0][0]))[:30]
    for f, ((name, file, line), (nc, tt, ct, n)) in zip(top["functions"], want):
        assert (f["name"], f["file"], f["line"], f["calls"], f["folders"]) == (name, file, line, nc, n)
        assert abs(f["self_s"] - tt) < 1e-9 and abs(f["total_s"] - ct) < 1e-9
    totals = [f["total_s"] for f in top["functions"]]
    assert totals == sorted(totals, reverse=True) and len(totals) == 30
    # The setup window's functions are not in the merge.
    setup = {(f["name"], f["file"]) for f in groups[0]["functions"]} - \
            {(f["name"], f["file"]) for w in step_folders for f in w["functions"]}
    assert setup and not setup & {(f["name"], f["file"]) for f in top["functions"]}

    html = page(trainprof_bin, job, tmp_path)
    sec = section(html, '<h3 id="python-windows">')
    assert "<td>train steps 240–242 · cProfile</td><td>743-vm</td><td class=\"n\">6</td>" in sec
    assert "<details id=\"python-window-1\"><summary>train steps 203–204 · cProfile · 743-vm</summary>" in sec
    assert "<details open id=\"python-window-0\"><summary>before the first step · cProfile · 743-vm</summary>" in sec
    # Raw folder names only as a folder's tooltip, never as a heading.
    assert not re.search(r"<summary>[^<]*prestepzero", sec)
    assert "Top functions over the step windows" in sec


# --- hostile native windows ------------------------------------------------------------------------


XSS = "</title></svg><script>document.title='xss'</script><img src=x onerror=alert(1)>"


def svg_frames(frames, total):
    """An inferno-like flamegraph.svg with `frames` = [(name, depth, x, w)], inferno's script
    and an onload handler included."""
    height = (max(d for _, d, _, _ in frames) + 1) * 16 + 50
    out = [f'<?xml version="1.0" standalone="no"?><svg version="1.1" width="1200" height="{height}" onload="init(evt)" '
           'xmlns="http://www.w3.org/2000/svg" xmlns:fg="http://github.com/jonhoo/inferno">'
           '<script type="text/ecmascript"><![CDATA[document.title="svg-script-ran"]]></script>'
           f'<svg id="frames" x="10" width="1180" total_samples="{total}">']
    for name, d, x, w in frames:
        esc = name.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
        out.append(f'<g><title>{esc} ({w} samples, {100.0 * w / total:.2f}%)</title><rect x="0%" '
                   f'y="{height - 33 - 16 * d}" width="1%" height="15" fill="rgb(1,2,3)" fg:x="{x}" fg:w="{w}" '
                   f'onmouseover="alert(3)"/><text x="0%" y="0">..</text></g>')
    out.append("</svg></svg>")
    return "".join(out)


def _varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if not v:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def _field(num, value):
    if isinstance(value, int):
        return _varint(num << 3) + _varint(value)
    return _varint((num << 3) | 2) + _varint(len(value)) + value


def profile_pb(stacks):
    """A pprof Profile as the hook writes it: stacks = [(thread, [names leaf first], samples)]."""
    strings, funcs = ["", "thread"], []

    def sid(s):
        if s not in strings:
            strings.append(s)
        return strings.index(s)

    out = b""
    for thread, names, n in stacks:
        locs = []
        for name in names:
            if name not in funcs:
                funcs.append(name)
            locs.append(funcs.index(name) + 1)
        label = _field(1, 1) + _field(2, sid(thread))
        sample = _field(1, b"".join(_varint(x) for x in locs)) + _field(2, _varint(n) + _varint(n * 10_000_000)) \
            + _field(3, label)
        out += _field(2, sample)
    for i, _ in enumerate(funcs):
        out += _field(4, _field(1, i + 1) + _field(4, _field(1, i + 1)))
    for i, name in enumerate(funcs):
        out += _field(5, _field(1, i + 1) + _field(2, sid(name)))
    for s in strings:
        out += _field(6, s.encode())
    return gzip.compress(out)


def window(root, name, node="0-algo-1"):
    d = root / "framework" / "native" / node / name
    d.mkdir(parents=True)
    return d


def test_hostile_native_windows_stay_text_and_cost_bounded_memory(trainprof_bin, tmp_path):
    root = tmp_path / "job"
    outside = tmp_path / "outside"
    outside.mkdir()
    # 1. A profile with a hostile and a mangled name, beside an SVG that is not read.
    w = window(root, "1795400000000000-1795400001000000_7")
    (w / "profile.pb.gz").write_bytes(profile_pb([("main", [XSS, "_ZN3foo3barEv", "main"], 6), ("main", ["main"], 1)]))
    (w / "flamegraph.svg").write_text(svg_frames([("all", 0, 0, 1), ("svg-was-read", 1, 0, 1)], 1))
    # 2. Only an SVG: script, handlers, a hostile frame name.
    w = window(root, "1795400002000000-1795400003000000_7")
    (w / "flamegraph.svg").write_text(svg_frames([("all", 0, 0, 4), ("python3", 1, 0, 4), (XSS, 2, 0, 3)], 4))
    # 3. A gzip bomb (256 MiB of zeros in about 250 KiB) and an SVG past the 64 MiB cap.
    w = window(root, "1795400004000000-1795400005000000_7")
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(MB)
    bomb = b"".join(z.compress(chunk) for _ in range(256)) + z.flush()
    (w / "profile.pb.gz").write_bytes(bomb)
    with open(w / "flamegraph.svg", "wb") as f:
        f.write(svg_frames([("all", 0, 0, 1), ("huge-file-was-read", 1, 0, 1)], 1).encode())
        f.write(b"<!--" + b"x" * (65 * MB) + b"-->")
    # 4. Links: a window's files and a whole window folder pointing outside.
    secret = outside / "flamegraph.svg"
    secret.write_text(svg_frames([("all", 0, 0, 1), ("secret-behind-a-link", 1, 0, 1)], 1))
    (outside / "profile.pb.gz").write_bytes(profile_pb([("t", ["secret-behind-a-link"], 1)]))
    w = window(root, "1795400006000000-1795400007000000_7")
    os.symlink(secret, w / "flamegraph.svg")
    os.symlink(outside / "profile.pb.gz", w / "profile.pb.gz")
    os.symlink(outside, root / "framework" / "native" / "0-algo-1" / "1795400008000000-1795400009000000_7")

    # The report's peak memory, measured by a small Python between (a child's maxrss counts its
    # parent's memory at fork: not this test's, which held the bomb).
    measure = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
               "sys.stderr.write('maxrss_kib=%d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
               "sys.exit(r.returncode)")
    proc = subprocess.run([sys.executable, "-c", measure, str(trainprof_bin), "report", str(root), "--json",
                           "-o", str(tmp_path / "page.html")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout)
    maxrss = int(re.search(r"maxrss_kib=(\d+)", proc.stderr).group(1))
    # 64 MiB of unzipped bomb at most (measured: 80 MiB in all, 15 MiB without the bomb).
    assert maxrss < 150 * 1024, maxrss

    by = {w["window"]: w for w in m["native"]}
    assert sorted(by) == ["1795400000000000-1795400001000000_7", "1795400002000000-1795400003000000_7"]
    a = by["1795400000000000-1795400001000000_7"]
    assert (a["source"], a["samples"], a["cpu_s"]) == ("profile.pb.gz", 7, 0.07)
    assert [f["name"] for f in a["top_self"]] == [XSS, "main"]
    assert {f["name"] for f in a["top_total"]} == {XSS, "foo::bar()", "main"}
    b = by["1795400002000000-1795400003000000_7"]
    assert (b["source"], b["samples"], b["top_self"][0]["name"]) == ("flamegraph.svg", 4, XSS)
    skipped = "\n".join(m["job"]["skipped"])
    assert "1795400004000000-1795400005000000_7/profile.pb.gz: more than 67108864 bytes unzipped" in skipped
    assert "1795400004000000-1795400005000000_7/flamegraph.svg:" in skipped and "not read" in skipped
    assert skipped.count("1795400006000000-1795400007000000_7") == 2, skipped
    assert "1795400008000000-1795400009000000_7" in skipped

    html = (tmp_path / "page.html").read_text()
    for bad in ["svg-was-read", "huge-file-was-read", "secret-behind-a-link", "svg-script-ran", "init(evt)",
                "onmouseover", "<img", "document.title='xss'</script>"]:
        assert bad not in html, bad
    assert html.count("<script") == 3
    sec = section(html, '<section id="native">')
    assert "&lt;/title&gt;&lt;/svg&gt;&lt;script&gt;document.title=&#39;xss&#39;&lt;/script&gt;" in sec
    assert sec.count('<svg class="flame"') == 2 and sec.count("<svg") == 2
