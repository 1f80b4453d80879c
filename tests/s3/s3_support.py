"""What the upload tests share (tests/s3/conftest.py makes fixtures of it): a real
S3-compatible server (moto_server, from the venv) on 127.0.0.1, a TCP forwarder in front of
it that can be stopped and started again (the server "goes down" without losing what it
stores), and the environment an agent runs under.

Nothing here talks to anything but 127.0.0.1.
"""

import os
import pathlib
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import boto3
import pytest
from botocore.config import Config

ROOT = pathlib.Path(__file__).resolve().parents[2]

BUCKET = "trainprof-test"
ACCESS_KEY = "AKIATRAINPROFTEST"
# Distinctive, so that a test can tell whether it leaked into any output.
SECRET = "trainprof-secret-do-not-log-8f3a"
REGION = "us-east-1"

SERVER_START_S = 10.0  # moto_server answers in well under a second here
SERVER_STOP_S = 5.0

# Variables that would change which credentials, endpoint or config an agent uses.
_AWS_CLEARED = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
                "SMPROFILER_CONFIG_PATH")
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def free_port() -> int:
    """A port nobody listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_env(s3_endpoint=None, **extra):
    """A copy of os.environ for an agent (or a trainer) that talks to the test server only:
    the test credentials and region; no profile, session token, endpoint override, shared
    config or credentials file (an ``endpoint_url`` there would apply too), no instance
    metadata look-up, no HTTP proxy, and no TRAINPROF_* / SMPROFILER_CONFIG_PATH.

    The endpoint itself goes on the command line (``--s3-endpoint``), never into
    AWS_ENDPOINT_URL, so that the tests prove the flag works; ``s3_endpoint`` only puts its
    host into NO_PROXY. ``extra``: more variables (None removes one)."""
    env = {
        k: v for k, v in os.environ.items()
        if k not in _AWS_CLEARED and k not in _PROXY_VARS
        and not k.startswith(("AWS_ENDPOINT_URL", "TRAINPROF_"))
    }
    env.update(
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET,
        AWS_DEFAULT_REGION=REGION,
        AWS_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
        # Empty files: nothing from a home folder's ~/.aws applies.
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    hosts = ["127.0.0.1", "localhost"]
    if s3_endpoint:
        host = s3_endpoint.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
        hosts.append(host)
    env["NO_PROXY"] = env["no_proxy"] = ",".join(dict.fromkeys(hosts))
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def s3_client(endpoint, **config):
    """A boto3 client for the test server: path-style, the test credentials, short timeouts."""
    cfg = dict(s3={"addressing_style": "path"}, retries={"max_attempts": 2, "mode": "standard"},
               connect_timeout=3, read_timeout=10)
    cfg.update(config)
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET,
        config=Config(**cfg),
    )


def kill_group(proc, timeout=SERVER_STOP_S):
    """SIGTERM to the process group that ``proc`` leads, SIGKILL if it is still there."""
    if proc.poll() is None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=timeout)
                break
            except subprocess.TimeoutExpired:
                continue
    # Anything the leader left in its group (it was the group's only member, but be sure).
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(timeout=timeout)


class S3Server:
    """A moto_server on 127.0.0.1 with one bucket, and a boto3 client for it."""

    def __init__(self, proc, port, log_path, bucket=BUCKET):
        self.proc = proc
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self.bucket = bucket
        self.log_path = log_path
        self.client = s3_client(self.endpoint)

    def url(self, prefix=""):
        """``s3://<bucket>/<prefix>``"""
        prefix = prefix.strip("/")
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"

    def keys(self, prefix=""):
        """Every key under ``prefix`` (all pages), sorted."""
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out.extend(o["Key"] for o in page.get("Contents", []))
        return sorted(out)

    def get(self, key) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def objects(self, prefix=""):
        """{key: bytes} for every object under ``prefix``."""
        return {k: self.get(k) for k in self.keys(prefix)}

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def _answers(endpoint) -> bool:
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=1) as r:
            return r.status < 500
    except urllib.error.HTTPError as e:
        return e.code < 500
    except OSError:
        return False


def start_moto(log_path):
    """Starts moto_server on a free port; returns (proc, port) once it answers HTTP."""
    exe = pathlib.Path(sys.executable).parent / "moto_server"
    if not exe.is_file():
        pytest.fail(f"{exe} missing: install moto[server] into the venv (tests/requirements.txt)")
    last = ""
    for _attempt in range(3):  # another process may take the free port before moto binds it
        port = free_port()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [str(exe), "-H", "127.0.0.1", "-p", str(port)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, killed whole at teardown
            )
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers(f"http://127.0.0.1:{port}"):
                return proc, port
            time.sleep(0.05)
        kill_group(proc)
        last = log_path.read_text(errors="replace")[-2000:]
        if proc.returncode is not None and "Address already in use" not in last:
            break
    pytest.fail(f"moto_server did not answer on 127.0.0.1 within {SERVER_START_S} s; its log:\n{last}")


class _Conn:
    """One forwarded connection: two sockets, two pump threads."""

    def __init__(self, client, upstream):
        self.client = client
        self.upstream = upstream
        self.threads = []
        self.pumps_left = 2

    def sockets(self):
        return (self.client, self.upstream)


class Proxy:
    """A TCP forwarder 127.0.0.1:<port> → 127.0.0.1:<target_port>, one thread per direction
    of each connection (daemon threads; all joined by ``stop()``). ``stop()`` closes the
    listening socket and every live connection (new connections are refused, requests in
    flight fail); ``start()`` listens again on the same port. The server behind it keeps
    running, and so keeps what it stores."""

    ACCEPT_BACKLOG = 64
    JOIN_S = 2.0

    def __init__(self, target_port, port=None):
        self.target_port = target_port
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._listener = None
        self._accept_thread = None
        self._conns = set()
        self.accepted = 0  # connections forwarded so far

    @property
    def running(self):
        return self._listener is not None

    def start(self):
        """Listen (again) on the same port."""
        if self._listener is not None:
            return
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", self.port))
        except OSError as e:
            s.close()
            raise RuntimeError(f"proxy cannot listen on 127.0.0.1:{self.port} again: {e}") from e
        s.listen(self.ACCEPT_BACKLOG)
        self._listener = s
        t = threading.Thread(target=self._accept_loop, args=(s,), name=f"proxy-accept-{self.port}", daemon=True)
        self._accept_thread = t
        t.start()

    def stop(self):
        """Refuse new connections and cut every live one; returns once all that is done."""
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown() wakes the blocked accept() on Linux; from then on connects are refused.
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        if self._accept_thread is not None:
            self._accept_thread.join(self.JOIN_S)
            if self._accept_thread.is_alive():
                raise RuntimeError("proxy: the accept thread did not stop")
            self._accept_thread = None
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for conn in conns:
            for sock in conn.sockets():
                _cut(sock)
        for conn in conns:
            for t in conn.threads:
                t.join(self.JOIN_S)
            for sock in conn.sockets():
                sock.close()
        stuck = [t.name for conn in conns for t in conn.threads if t.is_alive()]
        if stuck:
            raise RuntimeError(f"proxy: threads did not stop: {stuck}")

    def close(self):
        self.stop()

    def live_connections(self):
        with self._lock:
            return len(self._conns)

    def _accept_loop(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was shut down
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                _cut(client)
                client.close()
                continue
            conn = _Conn(client, upstream)
            with self._lock:
                if self._listener is not listener:  # stopped meanwhile
                    for sock in conn.sockets():
                        _cut(sock)
                        sock.close()
                    return
                self.accepted += 1
                for src, dst, name in ((client, upstream, "up"), (upstream, client, "down")):
                    conn.threads.append(threading.Thread(
                        target=self._pump, args=(src, dst, conn), name=f"proxy-{self.port}-{name}", daemon=True))
                self._conns.add(conn)
                for t in conn.threads:
                    t.start()

    def _pump(self, src, dst, conn):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        # Pass the half-close on; the last pump of a connection closes both sockets.
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        with self._lock:
            conn.pumps_left -= 1
            last = conn.pumps_left == 0
            if last:
                self._conns.discard(conn)
        if last:
            for sock in conn.sockets():
                sock.close()


def _cut(sock):
    """Cut a connection as a dying server would: reset on close, and wake whoever blocks
    on the socket now. (Closing is left to the caller.)"""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
