"""trainprof's PEP 517 build backend: maturin's, with libtrainprof_hook.so built first.

maturin packages one crate (pyproject.toml says why this shape). This backend builds the
other artefact, the hook library, with cargo, stages it in the wheel's data directory
(``[tool.maturin] data``: ``platlib/trainprof/`` lands in ``site-packages/trainprof/``,
where ``trainprof._lib.default_path()`` looks) and then hands every hook to maturin's own
backend. ``pip install .``, ``pip wheel .``, ``python -m build`` and ``scripts/wheel`` all
come through here, so there is one way a wheel is made.

Settings (``pip … --config-settings KEY=VALUE``, or ``-C`` for ``python -m build``):

* ``profile``: the Cargo profile of both artefacts (default ``release``); ``dev`` packages
  the debug build (what the tests install).
* ``maturin.build-args`` / ``build-args`` / ``MATURIN_PEP517_ARGS``: passed to maturin as
  before, after the profile.

Cargo's own variables apply to both builds: ``CARGO_TARGET_DIR`` (the library is taken from
where cargo says it wrote it, never from a guessed ``target/``), ``CARGO_BUILD_TARGET``,
``CARGO_BUILD_JOBS``. The wheel's tag is the lowest ``manylinux`` policy the binary
satisfies (maturin's audit, as ``maturin build`` tags; a PEP 517 build through maturin alone
would say plain ``linux``), and the wheel is refused when the library needs a newer glibc than
that tag promises, since maturin audits the binary only. No editable install: the library
would sit in site-packages while the package is imported from the source tree.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Mapping

# maturin's backend module has no type information: what it returns is checked here.
import maturin  # type: ignore[import-untyped]
from maturin import get_requires_for_build_sdist, get_requires_for_build_wheel

__all__ = [
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_wheel",
]

#: The hook library's package and file name.
HOOK_PACKAGE = "trainprof-hook"
LIB_NAME = "libtrainprof_hook.so"
#: A Cargo profile name (cargo's own rule: letters, digits, ``-`` and ``_``).
PROFILE = re.compile(r"[A-Za-z0-9_-]+")


class BuildError(RuntimeError):
    """The wheel cannot be built; the message says why."""


def _say(line: str) -> None:
    print(f"trainprof_build: {line}", file=sys.stderr, flush=True)


def _profile(config_settings: Mapping[str, Any] | None) -> str:
    profile = (config_settings or {}).get("profile", "release")
    if not isinstance(profile, str) or not PROFILE.fullmatch(profile):
        raise BuildError(f"config setting profile={profile!r} is not a Cargo profile name")
    return profile


def build_hook_library(profile: str) -> Path:
    """Builds the hook cdylib and returns the file cargo wrote: its path comes from cargo's
    own artefact messages, so CARGO_TARGET_DIR, a target triple and the profile's folder are
    whatever cargo made of them."""
    cmd = ["cargo", "build", "--locked", "--profile", profile, "-p", HOOK_PACKAGE,
           "--message-format=json-render-diagnostics"]
    _say("running " + " ".join(cmd))
    try:
        res = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    except FileNotFoundError:
        raise BuildError("no cargo on PATH: building trainprof needs Rust (https://rustup.rs)") from None
    if res.returncode != 0:
        raise BuildError(f"cargo build of {HOOK_PACKAGE} failed (exit status {res.returncode})")
    libs = []
    for line in res.stdout.splitlines():
        msg = json.loads(line) if line.startswith("{") else {}
        if msg.get("reason") == "compiler-artifact" and "cdylib" in msg["target"]["kind"]:
            libs += [Path(f) for f in msg["filenames"] if Path(f).name == LIB_NAME]
    if len(libs) != 1:
        raise BuildError(f"cargo reported {len(libs)} {LIB_NAME} files, expected one: {libs}")
    return libs[0]


def data_dir() -> Path:
    """pyproject.toml's ``[tool.maturin] data``, relative to the source tree (the cwd)."""
    return Path(maturin.get_config()["data"])


def stage_library(lib: Path) -> None:
    """Puts the library where maturin takes the wheel's data from, alone."""
    data = data_dir()
    shutil.rmtree(data, ignore_errors=True)
    (data / "platlib" / "trainprof").mkdir(parents=True)
    shutil.copyfile(lib, data / "platlib" / "trainprof" / LIB_NAME)


def glibc_needed(path: Path) -> tuple[int, ...]:
    """The newest ``GLIBC_x.y`` version the file names. The version names a library needs
    are NUL-terminated strings in its dynamic string table; scanning every byte for them finds
    those and perhaps more, never fewer, so the check below can refuse a good wheel but never
    pass a dishonest one. A scan rather than objdump or an ELF parser: no build dependency
    and no binutils on the build machine."""
    found = re.findall(rb"GLIBC_([0-9]+(?:\.[0-9]+)+)\x00", path.read_bytes())
    return max((tuple(int(x) for x in v.split(b".")) for v in found), default=(0,))


def check_tag(wheel: Path, lib: Path) -> None:
    """maturin chose the tag from the binary: the library may need no newer glibc."""
    m = re.search(r"manylinux_([0-9]+)_([0-9]+)_", wheel.name)
    need = glibc_needed(lib)
    if m and need > (int(m.group(1)), int(m.group(2))):
        wheel.unlink()
        raise BuildError(f"{lib} needs GLIBC_{'.'.join(map(str, need))}, newer than the tag of "
                         f"{wheel.name}: the wheel would be dishonest (removed)")
    _say(f"{wheel.name}: {LIB_NAME} needs GLIBC_{'.'.join(map(str, need))}")


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Mapping[str, Any] | None = None) -> str:
    # maturin refuses a missing data directory even where it writes only the metadata or
    # the sdist (a fresh clone has none yet); the library is not needed for either.
    data_dir().mkdir(parents=True, exist_ok=True)
    return str(maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings))


def build_wheel(wheel_directory: str, config_settings: Mapping[str, Any] | None = None,
                metadata_directory: str | None = None) -> str:
    profile = _profile(config_settings)
    lib = build_hook_library(profile)
    stage_library(lib)
    args = list(maturin.get_maturin_pep517_args(config_settings))
    args += ["--locked", "--profile", profile]
    if "--compatibility" not in args and "--manylinux" not in args:
        # An empty --compatibility is maturin's default policy (the lowest manylinux tag the
        # binary satisfies); left out, maturin's PEP 517 hook would choose plain `linux`.
        args.append("--compatibility")
    settings = {k: v for k, v in (config_settings or {}).items() if k not in ("profile", "build-args")}
    settings["maturin.build-args"] = args
    name = str(maturin.build_wheel(wheel_directory, settings, metadata_directory))
    check_tag(Path(wheel_directory) / name, lib)
    return name


def build_sdist(sdist_directory: str, config_settings: Mapping[str, Any] | None = None) -> str:
    """maturin's sdist, with the workspace made whole again. maturin keeps only the crates
    the binary needs and rewrites the workspace's member list to match; the hook's crate,
    the patched pprof and this backend come in through ``[tool.maturin] include``, and the
    original Cargo.toml goes back in, so that a wheel built from the sdist is this one."""
    data_dir().mkdir(parents=True, exist_ok=True)  # as for the metadata; not in the sdist
    name = str(maturin.build_sdist(sdist_directory, config_settings))
    path = Path(sdist_directory) / name
    manifest = Path("Cargo.toml").read_bytes()
    with tempfile.TemporaryDirectory(dir=sdist_directory) as tmp:
        fixed = Path(tmp) / name
        with tarfile.open(path) as src, tarfile.open(fixed, "w:gz", format=tarfile.PAX_FORMAT) as dst:
            top = src.getmembers()[0].name.split("/")[0]
            for member in src.getmembers():
                data = src.extractfile(member) if member.isfile() else None
                if member.name == f"{top}/Cargo.toml":
                    member.size = len(manifest)
                    data = io.BytesIO(manifest)
                dst.addfile(member, data)
        os.replace(fixed, path)
    return name
