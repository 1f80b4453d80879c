"""The test infrastructure itself: the moto server stores and serves objects, and the proxy
in front of it forwards while started, refuses connections while stopped, cuts requests in
flight, and comes back on the same port with the server's content intact."""

import errno
import socket
import threading
import time

import pytest
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError

from s3_support import SECRET, agent_env, s3_client


def connect(port):
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_server_stores_and_lists(s3):
    s3.client.put_object(Bucket=s3.bucket, Key="p/a/b.json", Body=b"x\n")
    for i in range(3):
        s3.client.put_object(Bucket=s3.bucket, Key=f"p/c/{i}", Body=bytes([i]))
    assert s3.keys("p/") == ["p/a/b.json", "p/c/0", "p/c/1", "p/c/2"]
    assert s3.get("p/a/b.json") == b"x\n"
    assert s3.url("p/") == f"s3://{s3.bucket}/p"
    assert s3.objects("p/c/") == {"p/c/0": b"\0", "p/c/1": b"\1", "p/c/2": b"\2"}


def test_proxy_refuses_when_stopped_and_forwards_when_started(s3, proxy):
    through = s3_client(proxy.endpoint, retries={"max_attempts": 1})
    through.put_object(Bucket=s3.bucket, Key="k/1", Body=b"one")
    assert [o["Key"] for o in through.list_objects_v2(Bucket=s3.bucket)["Contents"]] == ["k/1"]

    # A request in flight when the proxy stops fails: a connection that sent half a
    # request is cut (EOF or reset), not left hanging.
    accepted = proxy.accepted
    half = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    half.sendall(b"PUT /trainprof-test/k/2 HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
    deadline = time.monotonic() + 5
    while proxy.accepted == accepted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.live_connections() >= 1
    proxy.stop()
    try:
        assert half.recv(100) == b""
    except ConnectionResetError:
        pass
    half.close()
    assert proxy.live_connections() == 0
    assert not [t.name for t in threading.enumerate() if t.name.startswith("proxy-") and str(proxy.port) in t.name]

    with pytest.raises(ConnectionRefusedError) as e:
        connect(proxy.port)
    assert e.value.errno == errno.ECONNREFUSED
    with pytest.raises((EndpointConnectionError, ConnectionClosedError)):
        through.list_objects_v2(Bucket=s3.bucket)
    # The server behind it still runs.
    s3.client.put_object(Bucket=s3.bucket, Key="k/3", Body=b"three")

    proxy.start()
    keys = [o["Key"] for o in through.list_objects_v2(Bucket=s3.bucket)["Contents"]]
    assert keys == ["k/1", "k/3"]  # the half request never reached the server
    assert through.get_object(Bucket=s3.bucket, Key="k/1")["Body"].read() == b"one"
    proxy.stop()
    proxy.stop()  # idempotent
    proxy.start()
    connect(proxy.port)


def test_agent_env_holds_only_the_test_credentials(monkeypatch):
    monkeypatch.setenv("AWS_PROFILE", "someone")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "tok")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://elsewhere")
    monkeypatch.setenv("TRAINPROF_LOCAL_PATH", "x")
    monkeypatch.setenv("SMPROFILER_CONFIG_PATH", "y")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:1")
    env = agent_env("http://127.0.0.1:1234", EXTRA="1")
    assert env["AWS_SECRET_ACCESS_KEY"] == SECRET
    assert env["AWS_ACCESS_KEY_ID"] == "AKIATRAINPROFTEST"
    assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "us-east-1"
    assert env["AWS_EC2_METADATA_DISABLED"] == "true"
    assert env["EXTRA"] == "1"
    for k in env:
        assert k not in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "SMPROFILER_CONFIG_PATH", "HTTPS_PROXY"), k
        assert not k.startswith(("AWS_ENDPOINT_URL", "TRAINPROF_")), k
    assert "127.0.0.1" in env["NO_PROXY"].split(",")
