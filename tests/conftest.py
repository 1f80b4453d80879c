"""Shared fixtures for the Python side of the tests: where the built binary and library
are, and a real S3-compatible server (``s3``, with ``smdebug_s3`` pointing smdebug's S3
readers at it) for the upload tests (tests/s3) and the end-to-end tests (tests/e2e)."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "s3"))

from s3_support import S3Server, agent_env, kill_group, start_moto  # noqa: E402


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


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory) -> pathlib.Path:
    """A fake `libnvidia-ml.so.1` (two GPUs, agent/tests/c/fake_nvml.c) built with the real
    `cc`: the agent's GPU sampler loads it through TRAINPROF_NVML_LIB, as it would NVML."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler (cc) on PATH")
    out = tmp_path_factory.mktemp("nvml") / "libnvidia-ml.so.1"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(ROOT / "agent" / "tests" / "c" / "fake_nvml.c")], check=True)
    return out


@pytest.fixture
def s3(tmp_path):
    """A fresh moto_server on 127.0.0.1 with the bucket ``trainprof-test``; see S3Server."""
    log_path = tmp_path / "moto_server.log"
    proc, port = start_moto(log_path)
    server = S3Server(proc, port, log_path)
    try:
        server.client.create_bucket(Bucket=server.bucket)
        yield server
    finally:
        kill_group(proc)


@pytest.fixture
def smdebug_s3(s3, monkeypatch):
    """smdebug's S3 readers pointed at the test server (AWS_ENDPOINT_URL, the test
    credentials). Its S3Handler caches one boto3 client per process: cleared around the
    test, so that no test reads from an earlier test's server."""
    from smdebug.core.access_layer.s3handler import S3Handler

    for k, v in agent_env(s3.endpoint, AWS_ENDPOINT_URL=s3.endpoint).items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    for k in list(os.environ):
        if k.startswith("AWS_ENDPOINT_URL_") or k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(k)
    S3Handler.client.cache_clear()
    yield
    S3Handler.client.cache_clear()
