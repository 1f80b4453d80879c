"""The training image's checks for scripts/test-image (docs/testing.md, "The image tier").

    check_image.py IMAGE WORKDIR

IMAGE is a training image built from docker/Dockerfile (ENTRYPOINT `trainprof run --`);
WORKDIR an empty folder for the volumes and logs. `podman` comes from PATH with the
caller's CONTAINERS_CONF; `moto_server` and boto3 from this Python's venv. Each run is a
real container; each check prints `ok:` or `FAIL:` with what it saw, and the exit status is
the number of failures (0: all passed).

1. A finished job: `--memory 512m --cpus 1`, a non-root user, `--read-only` (no tmpfs
   either), the output on a volume, the image's own entrypoint. The system files name the
   container's limits; every file is sealed and owned by the user; nothing was written
   outside the volume (`podman diff`); the exit status is the trainer's; report.html is
   there, and `trainprof report --json` in a second container reads the volume.
2. `podman stop` during training, uploading to a moto_server on the host's loopback
   (`--network host`): the trainer's last words are in the log, the container's exit status
   is the trainer's (not podman's SIGKILL after `-t`), and every sealed file, both end
   markers and the page are in the bucket, byte for byte, by the time the container exits.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import boto3
from botocore.config import Config

UID = 4321  # not root, not the host user who built the image
MEMORY = 512 * 1024 * 1024
CPUS = 1.0
TERM_STATUS = 43  # the trainer's status on SIGTERM (tests/image/trainer.py)
EXIT_STATUS = 7  # the trainer's status after a full run
STOP_TIMEOUT_S = 60  # podman stop -t: SIGKILL after this (status 137)
BUCKET = "image-test"
PREFIX = "job-1"
ACCESS, SECRET, REGION = "testing", "testing-secret", "us-east-1"
REPO = pathlib.Path(__file__).resolve().parents[2]

failures = []


def check(ok, what, seen=""):
    if ok:
        print(f"ok: {what}")
    else:
        failures.append(what)
        print(f"FAIL: {what}" + (f"\n      saw: {seen}" if seen else ""))
    return ok


def podman(*args, check_rc=True, **kw):
    p = subprocess.run(["podman", *args], capture_output=True, text=True, **kw)
    if check_rc and p.returncode != 0:
        sys.exit(f"check_image: podman {' '.join(args[:3])}… failed ({p.returncode}):\n{p.stderr}")
    return p


def volume(workdir, name):
    d = workdir / name
    d.mkdir()
    os.chown(d, UID, UID)
    return d


def run_args(name, out, extra_env=()):
    """The platform's way: limits, a user, a read-only root, the output on a volume, the
    trainer and examples/ mounted read-only at /job."""
    args = [
        "run", "--name", name, "--user", f"{UID}:{UID}", "--read-only", "--read-only-tmpfs=false",
        "--memory", str(MEMORY), "--memory-swap", str(MEMORY), "--cpus", str(CPUS),
        "--hostname", "train-0",
        "-v", f"{out}:/opt/ml/output/profiler",
        "-v", f"{REPO / 'examples'}:/job/examples:ro",
        "-v", f"{REPO / 'tests' / 'image'}:/job/image:ro",
        "-e", "TRAINING_JOB_NAME=image-test-job",
    ]
    for kv in extra_env:
        args += ["-e", kv]
    return args


def files(root):
    return sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())


def system_rows(out):
    rows = []
    for f in (out / "system" / "incremental").rglob("*.json"):
        for line in f.read_text().splitlines():
            rows.append(json.loads(line))
    return rows


def check_output(out, label):
    """Sealed and owned: every entry the user's, no temporary left, both markers, a node
    record, the page."""
    entries = [p for p in out.rglob("*")]
    not_owned = [f"{p.relative_to(out)} uid {p.lstat().st_uid}" for p in entries if p.lstat().st_uid != UID]
    check(entries and not not_owned, f"{label}: every file and folder in the volume is owned by uid {UID}",
          not_owned[:5] or "an empty volume")
    tmp = [str(p.relative_to(out)) for p in entries if p.name.endswith(".tmp")]
    check(not tmp, f"{label}: no temporary file left (everything sealed)", tmp[:5])
    for marker in ("system/training_job_end.ts", "framework/training_job_end.ts"):
        check((out / marker).is_file(), f"{label}: {marker} written")
    timelines = list((out / "framework").rglob("*.json")) if (out / "framework").is_dir() else []
    check(any("pythontimeline" in p.name for p in timelines), f"{label}: the trainer's timeline sealed",
          [str(p.relative_to(out)) for p in timelines][:5])
    records = list((out / "system" / "node").rglob("*.json")) if (out / "system" / "node").is_dir() else []
    check(len(records) == 1, f"{label}: one node record", records)
    if records:
        rec = json.loads(records[0].read_text())
        job = rec.get("Job") or {}
        check(job.get("Host") == "train-0" and "sagemaker" in (job.get("Platforms") or [])
              and (job.get("Variables") or {}).get("TRAINING_JOB_NAME") == "image-test-job",
              f"{label}: the node record's Job names the container's host and job", job)
    check((out / "report.html").is_file(), f"{label}: report.html written into the volume",
          sorted(p.name for p in out.iterdir()))


def check_limits(out):
    rows = system_rows(out)
    check(rows, "system files have rows")
    limit = {r["Value"] for r in rows if r["Type"] == "ram" and r["Name"] == "MemoryLimitBytes"
             and r["Dimension"] == "cgroup"}
    check(limit == {MEMORY}, f"memory total is the container's: ram/MemoryLimitBytes/cgroup = {MEMORY}"
          f" (the host has {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')})", limit or "no such row")
    host_scope = [r for r in rows if r["Type"] == "ram" and r["Dimension"] == "host"]
    check(not host_scope, "memory is taken of the cgroup, never of the host", host_scope[:2])
    cores = {r["Value"] for r in rows if r["Type"] == "container" and r["Name"] == "CPUQuotaCores"}
    check(cores == {CPUS}, f"CPU count is the container's: container/CPUQuotaCores = {CPUS:g}"
          f" (the host has {os.cpu_count()})", cores or "no such row")


def run_finished(image, workdir):
    out = volume(workdir, "finished")
    name = f"trainprof-image-finished-{os.getpid()}"
    p = podman(*run_args(name, out, [f"EXIT_STATUS={EXIT_STATUS}", "TRAIN_STEPS=30"]),
               image, "python3", "/job/image/trainer.py", check_rc=False)
    (workdir / "finished.log").write_text(p.stdout + p.stderr)
    print(f"== 1. a finished job (exit {p.returncode}); log: {workdir / 'finished.log'}")
    try:
        check(p.returncode == EXIT_STATUS, f"the container's exit status is the trainer's ({EXIT_STATUS})",
              f"{p.returncode}; stderr tail: {p.stderr[-800:]}")
        check("trainer: pid" in p.stdout and f"uid {UID}" in p.stdout, f"the trainer ran as uid {UID}", p.stdout[-400:])
        check_output(out, "finished")
        check_limits(out)
        # The runtime's own changes are allowed: the mount points (and their parents) and /etc,
        # where it binds hosts, hostname and resolv.conf.
        mounts = json.loads(podman("inspect", "-f", "{{json .Mounts}}", name).stdout)
        allowed = {"/etc"}
        for m in mounts:
            d = pathlib.PurePosixPath(m["Destination"])
            allowed.update(str(a) for a in [d, *d.parents])
        diff = [line for line in podman("diff", name).stdout.splitlines()
                if line.strip() and line.split(None, 1)[-1] not in allowed]
        check(not diff, "nothing written outside the volume (podman diff: mount points and /etc only)", diff[:10])
    finally:
        podman("rm", "-f", name, check_rc=False)

    # A second container reads the volume (read-only) with `trainprof report`.
    p = podman("run", "--rm", "--user", f"{UID}:{UID}", "--read-only", "-v", f"{out}:/data:ro",
               "--entrypoint", "trainprof", image, "report", "/data", "--json", check_rc=False)
    try:
        rep = json.loads(p.stdout) if p.returncode == 0 else None
    except json.JSONDecodeError:
        rep = None
    text = json.dumps(rep) if rep is not None else ""
    check(rep is not None and "algo-1" in text and "image-test-job" in text,
          "`trainprof report --json` in a second container reads the volume (node algo-1, the job's name)",
          f"exit {p.returncode}: {p.stderr[-600:]} {p.stdout[:300]}")


def start_moto(workdir):
    exe = pathlib.Path(sys.executable).parent / "moto_server"
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log = open(workdir / "moto.log", "w")
        proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + 15
        while time.monotonic() < end and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return proc, port
            except OSError:
                time.sleep(0.1)
        proc.kill()
        proc.wait()
    sys.exit(f"check_image: moto_server did not start; see {workdir / 'moto.log'}")


def wait_for_log(name, needle, timeout_s):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        p = podman("logs", name, check_rc=False)
        if needle in p.stdout + p.stderr:
            return True
        state = podman("inspect", "-f", "{{.State.Running}}", name, check_rc=False).stdout.strip()
        if state == "false":
            return False
        time.sleep(0.5)
    return False


def run_stopped(image, workdir):
    out = volume(workdir, "stopped")
    name = f"trainprof-image-stopped-{os.getpid()}"
    moto, port = start_moto(workdir)
    endpoint = f"http://127.0.0.1:{port}"
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS,
                      aws_secret_access_key=SECRET, config=Config(s3={"addressing_style": "path"}))
    s3.create_bucket(Bucket=BUCKET)
    env = [f"TERM_STATUS={TERM_STATUS}", "TRAIN_STEPS=1000000", f"TRAINPROF_S3_OUTPUT_PATH=s3://{BUCKET}/{PREFIX}",
           f"AWS_ENDPOINT_URL={endpoint}", f"AWS_ACCESS_KEY_ID={ACCESS}", f"AWS_SECRET_ACCESS_KEY={SECRET}",
           f"AWS_REGION={REGION}", "AWS_EC2_METADATA_DISABLED=true"]
    try:
        # --keep-local: the sealed files stay in the volume, to compare with the bucket.
        podman(*run_args(name, out, env), "--network", "host", "-d", "--entrypoint", "trainprof", image,
               "run", "--keep-local", "--", "python3", "/job/image/trainer.py")
        print("== 2. podman stop during training, uploading to a moto_server on the host's loopback")
        if not check(wait_for_log(name, "step  10", 300), "the trainer reached step 10 before the stop",
                     podman("logs", name, check_rc=False).stderr[-800:]):
            return
        t0 = time.monotonic()
        podman("stop", "-t", str(STOP_TIMEOUT_S), name, check_rc=False)
        stop_s = time.monotonic() - t0
        status = int(podman("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip())
        logs = podman("logs", name, check_rc=False)
        (workdir / "stopped.log").write_text(logs.stdout + logs.stderr)
        print(f"   stopped in {stop_s:.1f} s; log: {workdir / 'stopped.log'}")
        check(status == TERM_STATUS, f"the container's exit status is the trainer's ({TERM_STATUS}),"
              f" not a SIGKILL after -t {STOP_TIMEOUT_S} (137)", status)
        check("trainer: SIGTERM, last words" in logs.stdout + logs.stderr,
              "SIGTERM reached the trainer (its last words are in the log)", logs.stdout[-600:])
        check_output(out, "stopped")
        keys = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX + "/"):
            for o in page.get("Contents", []):
                keys[o["Key"][len(PREFIX) + 1:]] = o["Key"]
        local = [str(p.relative_to(out)) for p in files(out)
                 if p.relative_to(out).parts[0] in ("system", "framework")
                 and not any(part.startswith(".") for part in p.relative_to(out).parts)]
        missing = [k for k in local if k not in keys]
        check(local and not missing, f"every sealed file ({len(local)}) is in the bucket when the container has exited",
              missing[:5])
        differ = [k for k in local if k in keys and s3.get_object(Bucket=BUCKET, Key=keys[k])["Body"].read()
                  != (out / k).read_bytes()]
        check(not differ, "the bucket's copies are byte for byte the volume's", differ[:5])
        for marker in ("system/training_job_end.ts", "framework/training_job_end.ts", "report.html"):
            check(marker in keys, f"{marker} uploaded", sorted(keys)[:8])
    finally:
        podman("rm", "-f", name, check_rc=False)
        os.killpg(moto.pid, 15)
        moto.wait()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    image, workdir = sys.argv[1], pathlib.Path(sys.argv[2])
    run_finished(image, workdir)
    run_stopped(image, workdir)
    if failures:
        print(f"check_image: {len(failures)} check(s) failed")
    else:
        print("check_image: every check passed")
    return min(len(failures), 100)


if __name__ == "__main__":
    sys.exit(main())
