"""Shared fixtures for the Python side of the tests: where the built binary is."""

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
