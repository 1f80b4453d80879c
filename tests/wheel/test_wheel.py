"""The wheel, built and installed the way a user does it (README, "Install"; docs/install.md).

A fresh clone (the checkout's files that git tracks or would track, nothing it ignores:
no target/, no venv, no wheel) is built two ways, through the one PEP 517 backend:

* `scripts/wheel --profile dev` from that copy: it must bootstrap its own build tools (pip's
  build isolation fetches maturin) and take the library from where `CARGO_TARGET_DIR` says
  cargo built it, not from a `target/` in the copy (a stale one is planted there);
* `pip install --config-settings profile=dev <copy>` into a fresh `python -m venv`, build
  isolation on;
* the sdist made from that copy (the backend's `build_sdist`, called as a front end calls
  it), `pip install`ed the same way into another fresh venv.

Then, from each venv, with no TRAINPROF_* variable set and from a folder outside the
repository: `trainprof --version` from the venv's bin/, and `trainprof run --local-path X --
python trainer.py`, where the trainer imports the installed package and records a few steps.
The package must come from the venv's site-packages and load the library inside itself, and
the system files and the timeline must be written and sealed. Also: the wheel's platform tag
is no lower than the glibc either artefact needs.

Why `profile=dev` and the checkout's own cargo target folder: a release build from nothing
takes minutes on CI's two cores, while `scripts/test` has just built the debug one. The copy
sits at a fixed place inside that folder and keeps the files' times, so cargo reuses every
dependency and, after the first run, the workspace's crates too; only the packaging runs.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TARGET = ROOT / (os.environ.get("CARGO_TARGET_DIR") or "target")  # an absolute value wins
STEPS = 5
LIB = "libtrainprof_hook.so"
# What a checkout without git (a docker build context) leaves out: what .gitignore lists.
NOT_SOURCES = shutil.ignore_patterns("target", ".git", ".venv*", "dist", "__pycache__", "*.pyc",
                                     ".pytest_cache", "trainprof-output")

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
print("trainer: package", trainprof.__file__)
print("trainer: library", where)
"""


def clean_env(**extra):
    """The caller's environment less anything that could point at the repository's build
    or another config: no TRAINPROF_*, no SMPROFILER_*, no PYTHONPATH, no active venv, no
    CARGO_TARGET_DIR unless given here."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRAINPROF_", "SMPROFILER_", "PYTHON", "VIRTUAL_ENV", "CARGO_TARGET_DIR"))}
    env.update(extra)
    return env


def glibc_needed(path):
    out = subprocess.run(["objdump", "-T", str(path)], check=True, capture_output=True, text=True).stdout
    versions = {tuple(int(x) for x in m.split(".")) for m in re.findall(r"GLIBC_([0-9][0-9.]*[0-9])", out)}
    return max(versions)


def source_files():
    """The checkout's files as a fresh clone has them: tracked, or new and not ignored."""
    if (ROOT / ".git").exists():
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], check=True, capture_output=True).stdout
        return [p for p in out.decode().split("\0") if p and os.path.lexists(ROOT / p)]
    return None


@pytest.fixture(scope="module")
def checkout():
    dest = TARGET / "wheel-test" / "checkout"
    shutil.rmtree(dest, ignore_errors=True)
    files = source_files()
    if files is None:
        shutil.copytree(ROOT, dest, symlinks=True, ignore=NOT_SOURCES)
    for rel in files or []:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel, follow_symlinks=False)  # times kept: cargo reuses
    assert not (dest / "target").exists() and not (dest / ".venv").exists()
    return dest


@pytest.fixture(scope="module")
def wheel(checkout, tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # What scripts/wheel once packaged whatever CARGO_TARGET_DIR said: a stale target/.
    stale = checkout / "target" / "debug" / LIB
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"a stale library from another build")
    env = clean_env(CARGO_TARGET_DIR=str(TARGET))
    res = subprocess.run([str(checkout / "scripts" / "wheel"), "--profile", "dev", "--out", str(out)],
                         cwd=checkout, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    path = pathlib.Path(res.stdout.strip().splitlines()[-1])
    assert path.is_file() and path.parent == out, res.stdout
    shutil.rmtree(checkout / "target")
    return path


@pytest.fixture(scope="module")
def wheel_venv(wheel, tmp_path_factory):
    """A fresh venv (no pip of its own, to save the seconds ensurepip takes) and scripts/wheel's
    wheel installed into it by pip, with no index and no dependencies."""
    root = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, env=clean_env())
    python = root / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--disable-pip-version-check", "--no-index", "--no-deps", str(wheel)],
                   check=True, env=clean_env(), timeout=300)
    return root


def pip_install(what, root, *pip_args):
    """`python -m venv` (pip and nothing else), then `pip install WHAT`: pip's build isolation
    fetches maturin from the index, the in-tree backend builds both artefacts."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, env=clean_env())
    res = subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                          *pip_args, "--config-settings", "profile=dev", str(what)],
                         cwd=root, env=clean_env(CARGO_TARGET_DIR=str(TARGET)),
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    return root


@pytest.fixture(scope="module")
def pip_venv(checkout, tmp_path_factory):
    return pip_install(checkout, tmp_path_factory.mktemp("pip-venv") / "venv")


@pytest.fixture(scope="module")
def sdist(checkout, tmp_path_factory):
    """The backend's build_sdist, run as a front end runs it: in the source tree, with the
    backend's folder on sys.path and maturin from the test venv (scripts/venv installs it)."""
    out = tmp_path_factory.mktemp("sdist")
    env = clean_env(PYTHONPATH=str(checkout / "build-backend"),
                    PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    res = subprocess.run([sys.executable, "-c", f"import trainprof_build as b; print(b.build_sdist({str(out)!r}))"],
                         cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return out / res.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sdist_venv(sdist, tmp_path_factory):
    # No wheel cache: pip would otherwise reuse the wheel it built from an sdist of the same name.
    return pip_install(sdist, tmp_path_factory.mktemp("sdist-venv") / "venv", "--no-cache-dir")


@pytest.fixture(scope="module")
def backend():
    """The build backend's module, imported as a front end imports it (maturin from the test
    venv)."""
    sys.path.insert(0, str(ROOT / "build-backend"))
    try:
        import trainprof_build
    finally:
        sys.path.remove(str(ROOT / "build-backend"))
    return trainprof_build


def installed(venv):
    """The venv's trainprof files, by path inside the venv. (Not their bytes: the debug
    info names the folder each was built in.)"""
    site = next(venv.glob("lib/python3*/site-packages"))
    files = [venv / "bin" / "trainprof", *sorted((site / "trainprof").rglob("*"))]
    return {str(f.relative_to(venv)) for f in files if f.is_file() and "__pycache__" not in f.parts}


def test_wheel_contents_and_tag(wheel):
    name = wheel.name
    assert re.fullmatch(r"trainprof-\d+\.\d+\.\d+-py3-none-(manylinux_\d+_\d+|linux)_x86_64\.whl", name), name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        data = f"trainprof-{name.split('-')[1]}.data"
        assert f"{data}/scripts/trainprof" in names
        assert f"{data}/platlib/trainprof/{LIB}" in names
        assert {"trainprof/__init__.py", "trainprof/_lib.py", "trainprof/torch.py"} <= names
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        tmp = wheel.parent / "unpacked"
        z.extract(f"{data}/scripts/trainprof", tmp)
        z.extract(f"{data}/platlib/trainprof/{LIB}", tmp)
    # The library cargo built where CARGO_TARGET_DIR says, not the stale one in target/.
    assert (tmp / data / "platlib" / "trainprof" / LIB).read_bytes() == (TARGET / "debug" / LIB).read_bytes()
    m = re.search(r"manylinux_(\d+)_(\d+)_", name)
    if m:  # the tag promises this glibc: neither artefact may need a newer one
        tag = (int(m.group(1)), int(m.group(2)))
        for f in (f"{data}/scripts/trainprof", f"{data}/platlib/trainprof/{LIB}"):
            assert glibc_needed(tmp / f) <= tag, (f, glibc_needed(tmp / f), name)


def test_glibc_scan_finds_what_objdump_finds(backend, wheel):
    with zipfile.ZipFile(wheel) as z:
        lib = wheel.parent / LIB
        lib.write_bytes(z.read(f"trainprof-{wheel.name.split('-')[1]}.data/platlib/trainprof/{LIB}"))
    assert backend.glibc_needed(lib) == glibc_needed(lib)


def test_a_library_newer_than_the_tag_refuses_the_wheel(backend, tmp_path):
    lib = tmp_path / LIB
    lib.write_bytes(b"\x7fELF...GLIBC_2.2.5\x00GLIBC_2.34\x00...")
    honest = tmp_path / "trainprof-0.1.0-py3-none-manylinux_2_34_x86_64.whl"
    honest.write_bytes(b"")
    backend.check_tag(honest, lib)
    assert honest.exists()
    dishonest = tmp_path / "trainprof-0.1.0-py3-none-manylinux_2_17_x86_64.whl"
    dishonest.write_bytes(b"")
    with pytest.raises(backend.BuildError, match=r"needs GLIBC_2\.34, newer than the tag"):
        backend.check_tag(dishonest, lib)
    assert not dishonest.exists()  # never left for pip to install


def test_sdist_holds_the_whole_workspace(sdist):
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
        top = t.getnames()[0].split("/")[0]
        manifest = t.extractfile(f"{top}/Cargo.toml").read()
    assert manifest == (ROOT / "Cargo.toml").read_bytes()  # every member, the hook's included
    assert {"build-backend/trainprof_build.py", "hook-ffi/Cargo.toml", "hook-ffi/src/lib.rs",
            "vendor/pprof/Cargo.toml", "hook-ffi/python/trainprof/__init__.py"} <= names
    assert not [n for n in names if n.startswith("target/")], names  # nothing built


def test_every_way_installs_the_same_files(pip_venv, wheel_venv, sdist_venv):
    assert installed(pip_venv) == installed(wheel_venv) == installed(sdist_venv)


@pytest.mark.parametrize("venv_fixture", ["pip_venv", "wheel_venv", "sdist_venv"])
def test_installed_trainprof_runs_a_trainer(venv_fixture, request, tmp_path):
    venv = request.getfixturevalue(venv_fixture)
    bin_dir = venv / "bin"
    trainprof = bin_dir / "trainprof"
    assert trainprof.is_file(), sorted(p.name for p in bin_dir.iterdir())
    site = next(venv.glob("lib/python3*/site-packages"))
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
    assert f"trainer: package {site / 'trainprof' / '__init__.py'}" in res.stdout, res.stdout + res.stderr
    assert f"trainer: library {site / 'trainprof' / LIB}" in res.stdout, res.stdout + res.stderr

    files = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    temps = [p for p in files if p.endswith(".tmp")]
    assert not temps, temps  # every file sealed
    system = list(out.glob("system/incremental/*/*.algo-1.json"))
    assert system and all(p.stat().st_size > 0 for p in system), files
    assert (out / "system" / "training_job_end.ts").is_file(), files
    timelines = sorted(out.glob("framework/pevents/*/*_pythontimeline.json"))
    assert timelines, files
    events = [e for t in timelines for e in json.loads(t.read_text())]
    steps = [e for e in events if e.get("name") == "Step:ModeKeys.TRAIN"]
    assert len(steps) == STEPS, events
    assert sum(e.get("name") == "Net" for e in events) == STEPS, events
