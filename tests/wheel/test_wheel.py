"""The wheel, installed the way a user installs it (README, "Install").

`scripts/wheel --profile dev` (the debug build `scripts/test` has just made, so only the
packaging runs), a fresh venv with nothing but that wheel in it, and then, with no
TRAINPROF_* variable set and from a folder outside the repository: `trainprof --version`
from the venv's bin/, and `trainprof run --local-path X -- python trainer.py`, where the
trainer imports the installed package and records a few steps. The package must find the
library inside itself (no TRAINPROF_HOOK_LIB from anyone), and the timeline must be written
and sealed. Also: the wheel's platform tag is no lower than the glibc either artefact needs.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 5

TRAINER = f"""
import trainprof, trainprof._lib as lib
where, source = lib.resolve_path()
assert source == "the trainprof package directory", (where, source)
p = trainprof.Profiler(strict=True)    # raises when the library cannot be loaded
assert p.enabled, p
for _ in range({STEPS}):
    p.step_begin("train")
    with p.record("Forward", "Net"):
        sum(range(1000))
    p.step_end()
p.close()
print("trainer: library", where)
"""


def clean_env(**extra):
    """The caller's environment less anything that could point at the repository's build
    or another config: no TRAINPROF_*, no SMPROFILER_*, no PYTHONPATH, no active venv."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRAINPROF_", "SMPROFILER_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(extra)
    return env


def glibc_needed(path):
    out = subprocess.run(["objdump", "-T", str(path)], check=True, capture_output=True, text=True).stdout
    versions = {tuple(int(x) for x in m.split(".")) for m in re.findall(r"GLIBC_([0-9][0-9.]*[0-9])", out)}
    return max(versions)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # maturin from the test venv (scripts/venv installs it).
    env = clean_env(TRAINPROF_VENV=sys.prefix)
    res = subprocess.run([str(ROOT / "scripts" / "wheel"), "--profile", "dev", "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    path = pathlib.Path(res.stdout.strip().splitlines()[-1])
    assert path.is_file() and path.parent == out, res.stdout
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv (no pip of its own, to save the seconds ensurepip takes) and the wheel
    installed into it by pip, with no index and no dependencies."""
    root = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, env=clean_env())
    python = root / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--disable-pip-version-check", "--no-index", "--no-deps", str(wheel)],
                   check=True, env=clean_env(), timeout=300)
    return root


def test_wheel_contents_and_tag(wheel):
    name = wheel.name
    assert re.fullmatch(r"trainprof-\d+\.\d+\.\d+-py3-none-(manylinux_\d+_\d+|linux)_x86_64\.whl", name), name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        data = f"trainprof-{name.split('-')[1]}.data"
        assert f"{data}/scripts/trainprof" in names
        assert f"{data}/platlib/trainprof/libtrainprof_hook.so" in names
        assert {"trainprof/__init__.py", "trainprof/_lib.py", "trainprof/torch.py"} <= names
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        tmp = wheel.parent / "unpacked"
        z.extract(f"{data}/scripts/trainprof", tmp)
        z.extract(f"{data}/platlib/trainprof/libtrainprof_hook.so", tmp)
    m = re.search(r"manylinux_(\d+)_(\d+)_", name)
    if m:  # the tag promises this glibc: neither artefact may need a newer one
        tag = (int(m.group(1)), int(m.group(2)))
        for f in (f"{data}/scripts/trainprof", f"{data}/platlib/trainprof/libtrainprof_hook.so"):
            assert glibc_needed(tmp / f) <= tag, (f, glibc_needed(tmp / f), name)


def test_installed_wheel_runs_a_trainer(venv, tmp_path):
    bin_dir = venv / "bin"
    trainprof = bin_dir / "trainprof"
    assert trainprof.is_file(), sorted(p.name for p in bin_dir.iterdir())
    lib = next(venv.glob("lib/python3*/site-packages/trainprof/libtrainprof_hook.so"))
    # On PATH the way an activated venv puts it; the repository is nowhere on any path.
    env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    work = tmp_path / "work"
    work.mkdir()

    res = subprocess.run(["trainprof", "--version"], cwd=work, env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and res.stdout.startswith("trainprof "), res

    (work / "trainer.py").write_text(TRAINER)
    out = work / "X"
    res = subprocess.run(["trainprof", "run", "--interval-ms", "100", "--local-path", str(out), "--",
                          "python", "trainer.py"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"trainer: library {lib}" in res.stdout, res.stdout + res.stderr

    timelines = sorted(out.glob("framework/pevents/*/*_pythontimeline.json"))
    assert timelines, sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    temps = [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert not temps, temps  # every file sealed
    events = [e for t in timelines for e in json.loads(t.read_text())]
    steps = [e for e in events if e.get("name") == "Step:ModeKeys.TRAIN"]
    assert len(steps) == STEPS, events
    assert sum(e.get("name") == "Net" for e in events) == STEPS, events
