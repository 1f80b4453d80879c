"""The real-Prometheus tier (scripts/test-prometheus; docs/metrics.md, "Tested with a real
Prometheus"): a `trainprof agent --metrics-listen` over the fake NVML, scraped by a real
Prometheus server on 127.0.0.1 every second; then Prometheus's HTTP API must return the CPU,
memory and GPU series with the values the system files hold for the same ticks (each scrape
carries `trainprof_tick_timestamp_seconds`, which names the tick in the files).

    python3 tests/prometheus/check_prometheus.py TRAINPROF_BIN [PROMETHEUS_BIN]

Exit status 0 when every check holds."""

import json
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "agent"))
from metrics_support import Agent, row_value, system_rows  # noqa: E402

SCRAPES = 8


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base, path, **params):
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]


def matrix(base, expr, at):
    """{labels without __name__ and job/instance: {scrape time: value}} of `expr[5m]` at `at`."""
    out = {}
    for s in api(base, "query", query=f"{expr}[5m]", time=f"{at:.3f}")["result"]:
        labels = {k: v for k, v in s["metric"].items() if k not in ("__name__", "job", "instance")}
        out[tuple(sorted(labels.items()))] = {t: float(v) for t, v in s["values"]}
    return out


def main():
    trainprof = pathlib.Path(sys.argv[1]).resolve()
    prometheus = sys.argv[2] if len(sys.argv) > 2 else shutil.which("prometheus")
    assert prometheus, "no prometheus on PATH (apt-get install prometheus)"
    work = pathlib.Path(tempfile.mkdtemp(prefix="trainprof-prometheus-"))
    nvml = work / "libnvidia-ml.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(nvml), str(ROOT / "agent/tests/c/fake_nvml.c")], check=True)
    agent = Agent(trainprof, nvml, work / "profiler", interval_ms=100)
    prom = None
    try:
        agent.wait_for_tick()
        port = free_port()
        (work / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: trainprof\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{agent.port}']\n"
        )
        log = open(work / "prometheus.log", "w")
        prom = subprocess.Popen(
            [prometheus, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline and prom.poll() is None, (work / "prometheus.log").read_text()
            time.sleep(0.2)
        # Until Prometheus holds SCRAPES scrapes of the agent.
        deadline = time.time() + 60
        while True:
            ticks = matrix(base, "trainprof_tick_timestamp_seconds", time.time())
            n = sum(len(v) for v in ticks.values())
            if n >= SCRAPES:
                break
            assert time.time() < deadline, f"{n} scrapes after 60 s; targets: {api(base, 'targets')}"
            time.sleep(0.5)
        targets = api(base, "targets")["activeTargets"]
        assert [t["health"] for t in targets] == ["up"], targets
        at = time.time()
    finally:
        rc = agent.stop()
    assert rc == 0, agent.stderr
    if prom is None:
        raise AssertionError("prometheus never started")
    try:
        rows_by_ts = system_rows(work / "profiler")
        (key, tick_of), = ticks_all = list(matrix(base, "trainprof_tick_timestamp_seconds", at).items())
        assert dict(key) == {"node": "algo-1"}, key
        checked = {}

        def check(expr, row, scale=1.0, **want_labels):
            """Every scrape's value of `expr` (the series with `want_labels`) equals the file's
            row (Type, Name, Dimension) of the scraped tick."""
            series = matrix(base, expr, at)
            match = [v for k, v in series.items() if all(dict(k).get(a) == b for a, b in want_labels.items())]
            assert len(match) == 1, (expr, want_labels, list(series))
            n = 0
            for t, value in match[0].items():
                tick = tick_of.get(t)
                assert tick is not None, (expr, t)
                rows = rows_by_ts.get(tick)
                assert rows, f"tick {tick} in no system file"
                want = row_value(rows, *row)
                assert want is not None and value == want * scale, (expr, want_labels, t, tick, value, want)
                n += 1
            assert n >= SCRAPES, (expr, n)
            checked[f"{expr}{want_labels or ''}"] = n

        cores = sorted({r["Name"] for rows in rows_by_ts.values() for r in rows if r["Type"] == "cpu"})
        for c in cores:
            check("trainprof_cpu_core_busy_percent", ("cpu", c, "CPUUtilization"), core=c[3:])
        check("trainprof_cpu_busy_percent", ("host", "AllCores", "BusyPercent"))
        check("trainprof_memory_used_percent", ("memory", "MemoryUsedPercent", ""))
        scope = next(r["Dimension"] for rows in rows_by_ts.values() for r in rows if r["Type"] == "ram")
        check("trainprof_memory_used_bytes", ("ram", "MemoryUsedBytes", scope), scope=scope)
        for i in ("0", "1"):
            check("trainprof_gpu_utilization_percent", ("gpu", f"gpu{i}", "GPUUtilization"), gpu=i)
            check("trainprof_gpu_memory_used_percent", ("gpu", f"gpu{i}", "GPUMemoryUtilization"), gpu=i)
            check("trainprof_gpu_memory_used_bytes", ("accelerator", f"device{i}", "MemUsedBytes"), gpu=i)
            check("trainprof_gpu_temperature_celsius", ("accelerator", f"device{i}", "TemperatureCelsius"), gpu=i)
            check("trainprof_gpu_sm_clock_hertz", ("accelerator", f"device{i}", "SMClockMHz"), 1e6, gpu=i)
        check("trainprof_gpu_power_watts", ("accelerator", "device0", "PowerWatts"), gpu="0")
        # Counters keep `_total` through OpenMetrics.
        assert matrix(base, "trainprof_gpu_xid_events_total", at), "no Xid counter"
        uuids = {dict(k).get("uuid") for k in matrix(base, "trainprof_gpu_utilization_percent", at)}
        assert all(u and u.startswith("GPU-") for u in uuids), uuids
        print(f"ok: {len(tick_of)} scrapes by Prometheus, each the files' tick; {len(checked)} series checked: "
              + ", ".join(sorted(checked)))
        del ticks_all
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=30)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
