"""The README's first command, as written, the way a new user tries it on a fresh clone: from
the repository root, with the relative `--local-path trainprof-output`, on the built-in
defaults. It must leave `trainprof-output/report.html` (the page is made by a process that
runs in `/`, which once read a relative LocalPath from there). Then `report`, `trace` and
`compare` on the same relative path.

It runs in a temporary copy of what the command reads from the repository root (`examples/`,
the package in `hook-ffi/python`, and `target/debug/` linked to the build under test), so
the repository is left as it was and a user's own `trainprof-output/` is never touched. The
command's first part, `cargo build -q`, is the build this suite already ran
(`TRAINPROF_BIN`); the rest runs exactly as the README has it, through `sh -c`."""

import gzip
import json
import os
import pathlib
import shlex
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIMIT_S = 120


def first_command():
    """The first line of the README's first ```sh block."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("```sh")
    return lines[start + 1].strip()


def user_env():
    """The environment of a user who has set nothing for trainprof."""
    drop = ("TRAINPROF_", "SMPROFILER_", "SM_", "PYTHONPATH")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def repository_copy(tmp_path, trainprof_bin, hook_lib):
    root = tmp_path / "clone"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "examples", root / "examples", ignore=ignore)
    shutil.copytree(ROOT / "hook-ffi" / "python", root / "hook-ffi" / "python", ignore=ignore)
    debug = root / "target" / "debug"
    debug.mkdir(parents=True)
    (debug / "trainprof").symlink_to(trainprof_bin.resolve())
    (debug / "libtrainprof_hook.so").symlink_to(hook_lib.resolve())
    return root


def trainprof(root, *args):
    return subprocess.run([str(root / "target" / "debug" / "trainprof"), *args], cwd=root, env=user_env(),
                          capture_output=True, timeout=LIMIT_S)


def test_the_readme_s_first_command_as_written_leaves_the_page(tmp_path, trainprof_bin, hook_lib):
    build, sep, command = first_command().partition(" && ")
    assert (build, sep) == ("cargo build -q", " && "), first_command()
    argv = shlex.split(command)
    assert argv[0] == "target/debug/trainprof" and argv[1] == "run", command
    local_path = argv[argv.index("--local-path") + 1]
    assert not os.path.isabs(local_path), command
    root = repository_copy(tmp_path, trainprof_bin, hook_lib)

    proc = subprocess.run(["sh", "-c", command], cwd=root, env=user_env(), capture_output=True, text=True,
                          timeout=LIMIT_S)
    assert proc.returncode == 0, proc.stderr
    out = root / local_path
    page = out / "report.html"
    assert "no report" not in proc.stderr, proc.stderr
    assert f"trainprof: report: {page}" in proc.stderr.splitlines(), proc.stderr
    assert page.read_bytes().startswith(b"<!DOCTYPE html>")
    assert list((out / "framework").rglob("*pythontimeline.json")), "the trainer's steps were recorded"

    # The same relative path for the commands that look at results.
    p = trainprof(root, "report", local_path, "-o", "page.html")
    assert p.returncode == 0, p.stderr
    assert (root / "page.html").read_bytes().startswith(b"<!DOCTYPE html>")
    p = trainprof(root, "report", local_path, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["steps"], p.stdout[:500]
    p = trainprof(root, "trace", local_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(gzip.decompress((out / "trace.json.gz").read_bytes()))
    p = trainprof(root, "compare", local_path, local_path, "--json", "-o", "compare.html")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["steps"], p.stdout[:500]
    assert (root / "compare.html").read_bytes().startswith(b"<!DOCTYPE html>")


def readme_python():
    """The README's first ```python block: the lines a trainer adds."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("```python")
    return "\n".join(lines[start + 1 : lines.index("```", start + 1)])


def test_the_lines_the_readme_says_a_trainer_adds_record_its_steps(tmp_path, trainprof_bin, hook_lib):
    """The snippet, as written, around a loop of its own (`loader`, `train_step`), run under
    `trainprof run`: every step it takes is in the timeline and the run ends cleanly."""
    snippet = readme_python()
    assert "trainprof.Profiler(" in snippet and "prof.close()" in snippet, snippet
    root = repository_copy(tmp_path, trainprof_bin, hook_lib)
    trainer = root / "trainer.py"
    trainer.write_text(
        "import sys\nsys.path.insert(0, 'hook-ffi/python')\n"
        "loader = range(7)\ndef train_step(batch):\n    sum(range(10000))\n\n" + snippet + "\n"
    )
    proc = subprocess.run(
        ["target/debug/trainprof", "run", "--local-path", "out", "--no-report", "--", "python3", "trainer.py"],
        cwd=root, env=user_env(), capture_output=True, text=True, timeout=LIMIT_S,
    )
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line.rstrip(",\n"))
              for f in sorted((root / "out" / "framework").rglob("*pythontimeline.json"))
              for line in f.read_text().splitlines() if line.startswith("{")]
    steps = [e for e in events if e.get("name", "").startswith("Step:ModeKeys.TRAIN")]
    assert len(steps) == 7, [e.get("name") for e in events]
