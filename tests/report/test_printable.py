"""Names a trainer wrote with control characters in them (docs/report.md, "Untrusted input"):
a NUL, an ESC or a CR in a phase, op, mode or rank name reaches neither the page nor the
displayed `--json` text nor stderr raw; each is shown escaped (`\\x1b`), as stderr shows it."""

import json
import subprocess

T0 = 1_795_400_000_000_000  # the timeline's base time, epoch µs
RANK = "0-al\x1bgo-1"
MODE_PHASE = "Step:ModeKeys.TR\x1bAIN\r"
PHASE = "Forward\x1b[31m\x00"
OP = "aten::\x00conv\r2d"
RAW = ("\x00", "\x1b", "\r")


def write_job(root, mode_phase=MODE_PHASE, steps=40, ops=True, phase=PHASE):
    phases = [mode_phase, phase, "cpu_functions"]
    out = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": T0}}]
    out += [{"name": "process_name", "ph": "M", "pid": i + 1, "args": {"name": p}} for i, p in enumerate(phases)]
    for step in range(steps):
        a = step * 100_000
        out.append({"name": mode_phase, "pid": 1, "ph": "X", "ts": a, "dur": 90_000,
                    "args": {"step_num": str(step)}})
        out.append({"name": "fwd\x1b", "pid": 2, "ph": "X", "ts": a + 1_000, "dur": 50_000,
                    "args": {"step_num": str(step)}})
        if ops:
            out.append({"name": OP, "pid": 3, "ph": "X", "ts": a + 2_000, "dur": 10_000,
                        "args": {"step_num": str(step), "tid": 1}})
    d = root / "framework" / "pevents" / "2026112203"
    d.mkdir(parents=True)
    (d / f"{T0 + steps * 100_000 + 1}_{RANK}_pythontimeline.json").write_text(json.dumps(out))


def strings(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from strings(x)
    elif isinstance(v, list):
        for x in v:
            yield from strings(x)


def test_control_characters_in_names_are_escaped_on_the_page_in_json_and_on_stderr(trainprof_bin, tmp_path):
    job = tmp_path / "job"
    write_job(job)
    page = tmp_path / "report.html"
    proc = subprocess.run([str(trainprof_bin), "report", str(job), "--json", "-o", str(page)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    html = page.read_text()
    model = json.loads(proc.stdout)
    # The names are there, escaped (in the page's chart data as JSON text: backslashes doubled).
    shown = html.replace("\\\\", "\\")
    for name in ("TR\\x1bAIN\\x0d", "Forward\\x1b[31m\\x00", "0-al\\x1bgo-1"):
        assert name in shown, name
    assert any("aten::\\x00conv\\x0d2d" in s for s in strings(model)), "the op is in --json"
    for c in RAW:
        assert c not in html, repr(c)
        assert c not in proc.stderr, repr(c)
        bad = [s for s in strings(model) if c in s]
        assert not bad, bad[:5]


def test_an_extreme_gate_reads_as_a_number(trainprof_bin, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    # No ops nor Forward phase: steps in a detailed window are not compared.
    write_job(a, "Step:ModeKeys.TRAIN", 200, ops=False, phase="Compute")
    write_job(b, "Step:ModeKeys.TRAIN", 200, ops=False, phase="Compute")
    proc = subprocess.run([str(trainprof_bin), "compare", str(a), str(b), "--fail-if-slower", "1e308",
                           "-o", str(tmp_path / "compare.html")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "1e308 %" in proc.stderr, proc.stderr
    assert "0" * 20 not in proc.stderr + (tmp_path / "compare.html").read_text()
