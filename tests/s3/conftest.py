"""Fixtures for the upload tests (tests/s3): ``proxy``, a TCP forwarder in front of the
``s3`` server (tests/conftest.py) that can be stopped and started again. The classes and
helpers live in s3_support.py (test modules import them from there)."""

import pytest

from s3_support import Proxy


@pytest.fixture
def proxy(s3):
    """A Proxy in front of the ``s3`` server, listening; stopped at teardown."""
    p = Proxy(s3.port)
    p.start()
    try:
        yield p
    finally:
        p.close()
