"""`trainprof report s3://…` and `trainprof trace s3://…` against the real moto server of
tests/conftest.py: the download's bounds and skips (docs/report.md, "Inputs and outputs") and
the exit statuses (docs/report.md, "Exit status")."""

import json
import re
import subprocess
import urllib.parse

from s3_support import agent_env, free_port

NODE_LINE = {"Name": "CPUUtilization", "Dimension": "CPUUtilization", "Value": 40.0, "Type": "cpu",
             "NodeId": "algo-1"}


def system_file(start, n=5):
    return "".join(json.dumps({**NODE_LINE, "Timestamp": start + i}) + "\n" for i in range(n)).encode()


def trainprof(trainprof_bin, args, endpoint, cwd):
    return subprocess.run([str(trainprof_bin), *args, "--s3-endpoint", endpoint], capture_output=True, text=True,
                          timeout=120, env=agent_env(endpoint), cwd=cwd)


def gets(s3):
    """Keys of every GET of an object the server answered (its request log)."""
    pat = re.compile(r'"GET /' + re.escape(s3.bucket) + r'/([^ ?"]+)[^ "]* HTTP/1\.[01]" (\d{3})')
    return [urllib.parse.unquote(m.group(1)) for m in pat.finditer(s3.log())]


def test_conflicting_and_oversized_keys_are_skipped_one_by_one(trainprof_bin, s3, tmp_path):
    """`…/x` beside `…/x/y.json` used to fail the whole report (`x is not a folder`, exit 2); a
    100 MB python_stats was fetched whole and then refused. Now each is one `skipped:` line, the
    large one is never fetched, and the report is made from the rest."""
    hour = "job/system/incremental/2026010100"
    s3.client.put_object(Bucket=s3.bucket, Key=f"{hour}/1767225600.algo-1.json", Body=system_file(1767225600))
    s3.client.put_object(Bucket=s3.bucket, Key=f"{hour}/x", Body=system_file(1767225700))
    s3.client.put_object(Bucket=s3.bucket, Key=f"{hour}/x/1767225800.algo-1.json", Body=system_file(1767225800))
    big = "job/framework/pytorch/cprofile/0-algo-1/train-1-stepstart-1.0_train-2-stepstart-2.0/python_stats"
    s3.client.put_object(Bucket=s3.bucket, Key=big, Body=b"\0" * (100 << 20))
    # A key with `..` stays refused: nothing is written outside the download.
    s3.client.put_object(Bucket=s3.bucket, Key="job/system/incremental/../../../escaped.json",
                         Body=system_file(1767225900))
    proc = trainprof(trainprof_bin, ["report", s3.url("job"), "--json"], s3.endpoint, tmp_path)
    assert proc.returncode == 0, proc.stderr
    skipped = [line for line in proc.stderr.splitlines() if line.startswith("trainprof: skipped: s3://")]
    assert len(skipped) == 2, proc.stderr
    assert skipped[0].startswith(f"trainprof: skipped: {s3.url(big)}: 104857600 bytes, more than the 67108864 read"), skipped
    assert skipped[1].startswith(f"trainprof: skipped: {s3.url(hour)}/x/1767225800.algo-1.json: "), skipped
    assert big not in gets(s3)
    assert "trainprof: downloaded 2 files" in proc.stderr, proc.stderr
    model = json.loads(proc.stdout)
    assert model["job"]["nodes"] == ["algo-1"]
    assert not list(tmp_path.rglob("escaped.json"))


def test_exit_statuses_tell_nothing_to_report_from_an_unreadable_source(trainprof_bin, s3, tmp_path):
    """An empty prefix is "nothing to report" (1, like an empty folder); a missing bucket and
    a refused connection are "the source could not be read" (3); a bad URL is a bad argument
    (2). They used to be 2 alike."""
    for cmd in ("report", "trace"):
        empty = trainprof(trainprof_bin, [cmd, s3.url("nothing-here")], s3.endpoint, tmp_path)
        assert empty.returncode == 1, empty.stderr
        assert "no profiler files" in empty.stderr
        missing = trainprof(trainprof_bin, [cmd, "s3://no-such-bucket-trainprof/job"], s3.endpoint, tmp_path)
        assert missing.returncode == 3, missing.stderr
        assert "NoSuchBucket" in missing.stderr, missing.stderr
        refused = trainprof(trainprof_bin, [cmd, s3.url("job")], f"http://127.0.0.1:{free_port()}", tmp_path)
        assert refused.returncode == 3, refused.stderr
        bad = trainprof(trainprof_bin, [cmd, "s3:///job"], s3.endpoint, tmp_path)
        assert bad.returncode == 2, bad.stderr
    # Nothing is left in the current folder by any of them.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "moto_server.log") == []


def test_a_signal_during_the_download_removes_the_copy(trainprof_bin, tmp_path):
    """Ctrl-C (or SIGTERM) while `report s3://…` downloads: the downloaded copy is removed,
    then the command ends by that signal. It used to stay in the temporary folder. The
    endpoint is a server that accepts and never answers, so the signal always lands inside
    the download."""
    import os
    import signal
    import socket
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    endpoint = "http://127.0.0.1:%d" % server.getsockname()[1]
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            # At its default action whatever this suite inherited (a background job of a
            # non-interactive shell has SIGINT ignored, and `report` keeps it so).
            proc = subprocess.Popen([str(trainprof_bin), "report", "s3://bucket/job", "--s3-endpoint", endpoint],
                                    env=agent_env(endpoint, TMPDIR=str(tmpdir)), cwd=tmp_path,
                                    stderr=subprocess.PIPE, text=True,
                                    preexec_fn=lambda s=sig: signal.signal(s, signal.SIG_DFL))
            deadline = time.monotonic() + 30
            while not any(p.name.startswith("trainprof-report-") for p in tmpdir.iterdir()):
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.02)
            conn, _ = server.accept()  # the listing request: held, never answered
            proc.send_signal(sig)
            try:
                _, stderr = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise
            conn.close()
            assert proc.returncode == -sig, (proc.returncode, stderr)
            assert list(tmpdir.iterdir()) == [], stderr
            assert "the downloaded copy is removed" in stderr, stderr
    finally:
        server.close()
