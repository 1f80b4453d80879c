"""A `trainprof agent --metrics-listen 127.0.0.1:0` over the fake NVML, scraped over plain
HTTP, and the system files it wrote: shared by tests/agent/test_metrics_endpoint.py and the
real-Prometheus tier (scripts/test-prometheus, tests/prometheus)."""

import json
import os
import pathlib
import re
import resource
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

SERVING = re.compile(r"serving metrics at http://([0-9.]+):(\d+)/metrics")


class Agent:
    """`trainprof agent` sampling every `interval_ms` into `root`, serving metrics on a free
    port of 127.0.0.1. Its stderr is collected on a thread."""

    def __init__(self, trainprof_bin, fake_nvml, root, interval_ms=100, extra=(), run=None, env_extra=None, file_limit=None):
        """`run`: a command for `trainprof run -- CMD` instead of `trainprof agent`;
        `file_limit`: the agent's RLIMIT_NOFILE, soft and hard (it raises
        its soft limit to the hard one)."""
        self.root = pathlib.Path(root)
        self.interval_s = interval_ms / 1000
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPROF_", "SMPROFILER_", "FAKE_NVML_"))}
        env["TRAINPROF_NVML_LIB"] = str(fake_nvml)
        env["TRAINPROF_RESOURCE_CONFIG"] = str(self.root.parent / "no-resourceconfig.json")
        env["SMPROFILER_CONFIG_PATH"] = str(self.root.parent / "no-profilerconfig.json")
        env.update(env_extra or {})
        sub = ["run"] if run else ["agent"]
        tail = ["--", *run] if run else []
        self.proc = subprocess.Popen(
            [str(trainprof_bin), *sub, "--interval-ms", str(interval_ms), "--local-path", str(self.root),
             "--metrics-listen", "127.0.0.1:0", *extra, *tail],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (file_limit, file_limit)))
            if file_limit else None,
        )
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.time() + 60
        self.port = None
        while self.port is None:
            for line in list(self.lines):
                m = SERVING.search(line)
                if m:
                    self.port = int(m.group(2))
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise AssertionError("the agent never said where it serves:\n" + self.stderr)
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}/metrics"

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def stderr(self):
        return "".join(self.lines)

    def scrape(self, openmetrics=False, timeout=10, accept=None):
        """(status, content type, body) of one GET /metrics (`accept`: that Accept header)."""
        headers = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"} if openmetrics else {}
        if accept is not None:
            headers = {"Accept": accept}
        req = urllib.request.Request(self.url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.headers.get("Content-Type"), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type"), e.read().decode()

    def wait_for_tick(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.scrape()[0] == 200:
                return
            time.sleep(0.05)
        raise AssertionError("no tick served:\n" + self.stderr)

    def rss_bytes(self):
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        return self.proc.returncode


def system_rows(root):
    """Every line of the sealed system files under `root`, by Timestamp: {ts: [line, ...]}."""
    by_ts = {}
    for f in sorted(pathlib.Path(root, "system").rglob("*.json")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            by_ts.setdefault(row["Timestamp"], []).append(row)
    return by_ts


def row_value(rows, kind, name, dimension):
    for r in rows:
        if r["Type"] == kind and r["Name"] == name and r["Dimension"] == dimension:
            return r["Value"]
    return None
