"""The page at the end of `trainprof run --s3` (docs/report.md, "At the end of trainprof run"):
a real `run` uploading to the real moto server of tests/conftest.py ends with `report.html`
under the prefix and the summary line naming it, with and without --keep-local."""

import re
import subprocess
import sys

from s3_support import agent_env  # noqa: F401  (the environment helpers below use it)
from test_upload import (LOOP, MARKERS, RUN_TIMEOUT_S, env_for, hook_lib, put_log, sealed_files,  # noqa: F401
                         temporary_files, trainer_env, upload_args, uploaded, write_profiler_config)

PAGE = "report.html"


def run(trainprof_bin, argv, env):
    proc = subprocess.run([str(trainprof_bin), "run", *argv], env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def is_page(body):
    text = body.decode()
    return text.startswith("<!DOCTYPE html>") and "algo-1" in text


def test_keep_local_sends_the_page_after_the_rest(trainprof_bin, hook_lib, s3, tmp_path):
    out = tmp_path / "out"
    prefix = "jobs/page-keep"
    config = write_profiler_config(tmp_path / "profilerconfig.json", out)
    env = trainer_env(env_for(tmp_path, s3.endpoint, SMPROFILER_CONFIG_PATH=config), tmp_path, hook_lib,
                      {"phases": [["train", 20]], "work_ms": 20})
    stderr = run(trainprof_bin, [*upload_args(out, s3.url(prefix), s3.endpoint, "--keep-local"), "--",
                                 sys.executable, LOOP], env)
    local = sealed_files(out)
    remote = uploaded(s3, prefix)
    assert PAGE in local and is_page(local[PAGE])
    # The page is the same in S3, and S3 holds exactly the local files.
    assert sorted(remote) == sorted(local)
    assert remote[PAGE] == local[PAGE]
    assert f"trainprof: report: {out / PAGE} (uploaded to {s3.url(prefix)}/{PAGE})" in stderr.splitlines(), stderr
    # Made while the rest went up (the uploader does not wait for it), and sent by `run` after
    # the uploader's last object, the markers.
    puts = [k[len(prefix) + 1:] for k, status in put_log(s3) if status == 200 and k.startswith(prefix + "/")]
    assert puts[-1] == PAGE and max(puts.index(m) for m in MARKERS) < puts.index(PAGE), puts
    up = re.search(r"^trainprof: upload: (\d+) files? uploaded", stderr, re.M)
    assert up and int(up.group(1)) == len(local) - 1, stderr


def test_without_keep_local_the_page_is_made_from_s3_and_not_left_behind(trainprof_bin, hook_lib, s3, tmp_path):
    out = tmp_path / "out"
    prefix = "jobs/page-s3"
    config = write_profiler_config(tmp_path / "profilerconfig.json", out)
    env = trainer_env(env_for(tmp_path, s3.endpoint, SMPROFILER_CONFIG_PATH=config), tmp_path, hook_lib,
                      {"phases": [["train", 20]], "work_ms": 20})
    stderr = run(trainprof_bin, [*upload_args(out, s3.url(prefix), s3.endpoint), "--", sys.executable, LOOP], env)
    remote = uploaded(s3, prefix)
    assert PAGE in remote and is_page(remote[PAGE]), sorted(remote)
    # Made from this run's objects: the trainer's steps are in it.
    assert "TRAIN" in remote[PAGE].decode()
    assert f"trainprof: report: s3://{s3.bucket}/{prefix}/{PAGE}" in stderr.splitlines(), stderr
    # Uploaded and deleted, like every other file: the LocalPath is empty.
    assert sealed_files(out) == {}, sorted(sealed_files(out))
    assert temporary_files(out) == []
    # A second job into the same prefix: the page is never overwritten; this one's stays local.
    stderr2 = run(trainprof_bin, [*upload_args(out, s3.url(prefix), s3.endpoint), "--", sys.executable, LOOP], env)
    assert uploaded(s3, prefix)[PAGE] == remote[PAGE]
    assert re.search(r"^trainprof: report: .*report\.html \(not uploaded: .* not overwritten\)$", stderr2, re.M), stderr2
    assert list(sealed_files(out)) == [PAGE]


def test_no_time_left_keeps_the_page_local_with_one_line(trainprof_bin, s3, tmp_path):
    """--upload-deadline-s 0: no upload starts once the command has exited. When nothing went up
    while it ran, every file is still on disk: the page is made from them (the page has at least
    5 s), stays local, and one line says it was not uploaded. The node record, sealed before the
    command started (docs/formats.md, "Node record"), may have gone up while it ran: then the job
    is partly in S3, no time is left to read it there, and one line says how to make the page."""
    out = tmp_path / "out"
    prefix = "jobs/page-late"
    stderr = run(trainprof_bin, [*upload_args(out, s3.url(prefix), s3.endpoint, "--upload-deadline-s", "0"),
                                 "--", sys.executable, "-c", "pass"], env_for(tmp_path, s3.endpoint))
    lines = [line for line in stderr.splitlines() if line.startswith("trainprof: report:")]
    # Deterministic: not even the system file sealed at the end (which wakes the uploader)
    # reaches S3; only the node record may have, while the command ran.
    remote = uploaded(s3, prefix)
    assert all(k.startswith("system/node/") for k in remote), remote
    assert [k for k, _ in put_log(s3) if k.startswith(prefix + "/") and "/system/node/" not in k] == []
    m = re.search(r"^trainprof: upload: (\d+) files uploaded", stderr, re.M)
    assert m, stderr
    if int(m.group(1)) == 0:
        # (A PUT cut by the deadline may have reached S3 and still count as not sent.)
        assert lines == [f"trainprof: report: {out / PAGE} (not uploaded: see the upload lines)"], stderr
        assert (out / PAGE).is_file()
    else:
        assert lines == [
            "trainprof: report: skipped, no time left of --upload-deadline-s; "
            f"`trainprof report {s3.url(prefix)}` makes it"
        ], stderr


def test_a_page_that_aborts_or_hangs_costs_run_nothing(trainprof_bin, s3, tmp_path):
    """The page's process aborts (as a 448-byte cProfile file made the parser abort) or hangs
    (as one system line with a timestamp of 1e18 did): `run` still exits with the command's
    status, every file reaches S3 with the end markers, one line says there is no page, it
    returns within the deadline plus a few seconds, and the download folder of the page made
    from S3 is gone."""
    import os
    import time
    for how in ("abort", "hang"):
        for keep in (["--keep-local"], []):
            case = f"{how}{'-keep' if keep else ''}"
            out = tmp_path / case / "out"
            temp = tmp_path / case / "tmp"
            temp.mkdir(parents=True)
            prefix = f"jobs/page-{case}"
            env = {**env_for(tmp_path, s3.endpoint), "TRAINPROF_TEST_REPORT_CHILD": how, "TMPDIR": str(temp)}
            started = time.monotonic()
            proc = subprocess.run([str(trainprof_bin), "run", *upload_args(out, s3.url(prefix), s3.endpoint, *keep),
                                   "--upload-deadline-s", "3", "--", "sh", "-c", "sleep 0.5; exit 3"],
                                  env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
            took = time.monotonic() - started
            assert proc.returncode == 3, (case, proc.stderr)
            remote = uploaded(s3, prefix)
            assert all(m in remote for m in MARKERS), (case, sorted(remote))
            assert any(k.startswith("system/incremental/") for k in remote), (case, sorted(remote))
            assert PAGE not in remote
            if keep:
                assert sorted(remote) == sorted(sealed_files(out)), case
            lines = [line for line in proc.stderr.splitlines() if "report" in line]
            assert len(lines) == 1 and lines[0].startswith("trainprof: no report: "), (case, proc.stderr)
            assert "upload: 0 files left on local disk" in proc.stderr, (case, proc.stderr)
            # The page has at least 5 s; the rest is start-up, the last seal and the upload.
            assert took < 30, (case, took)
            assert os.listdir(temp) == [], case
