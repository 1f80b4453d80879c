"""Fixtures for the upload tests (tests/s3): ``s3``, a fresh moto_server on 127.0.0.1 with one
bucket, and ``proxy``, a TCP forwarder in front of it that can be stopped and started again.
The classes and helpers live in s3_support.py (test modules import them from there)."""

import pytest

from s3_support import (  # noqa: F401  (re-exported for the test modules)
    ACCESS_KEY,
    BUCKET,
    REGION,
    SECRET,
    Proxy,
    S3Server,
    agent_env,
    kill_group,
    s3_client,
    start_moto,
)


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
def proxy(s3):
    """A Proxy in front of the ``s3`` server, listening; stopped at teardown."""
    p = Proxy(s3.port)
    p.start()
    try:
        yield p
    finally:
        p.close()
