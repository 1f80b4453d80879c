"""Shared fixtures for the Python side of the tests: where the built binary and library are."""

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def trainprof_bin() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("TRAINPROF_BIN", ROOT / "target" / "debug" / "trainprof"))
    if not path.is_file():
        pytest.fail(f"{path} does not exist: build it first (scripts/test does)")
    return path


@pytest.fixture(scope="session")
def hook_lib() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("TRAINPROF_HOOK_LIB") or ROOT / "target" / "debug" / "libtrainprof_hook.so")
    if not path.is_file():
        pytest.fail(f"{path} does not exist: build it first (`cargo build -p trainprof-hook`; scripts/test does)")
    return path.resolve()


@pytest.fixture(scope="session")
def package_dir() -> pathlib.Path:
    """hook-ffi/python: what goes on PYTHONPATH for the trainprof package."""
    return ROOT / "hook-ffi" / "python"
