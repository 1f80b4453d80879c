"""The agent's S3 upload (docs/run.md, "Upload to S3 and crash repair") against a real S3-compatible server (moto_server on
127.0.0.1), read back with boto3 and with smdebug 1.0.34's S3 readers.

What is checked: every sealed file arrives with the same bytes and nothing temporary does;
local copies go once S3 has them (or stay, with --keep-local); an outage of the server loses
and duplicates nothing; SIGKILLed agents and trainers leave nothing behind that the next
agent does not repair and upload; a SIGTERM while the server is down ends within the upload
deadline and keeps the files; and the secret key never shows in any output.

Every test has its own server, LocalPath and prefix; every process a test starts is killed
at its end. Agents sample every 100 ms.
"""

import collections
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.parse

import pytest

from s3_support import SECRET, agent_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "hook-ffi" / "python"
LOOP = ROOT / "tests" / "hook" / "scripts" / "loop.py"

# Time budgets (seconds).
RUN_TIMEOUT_S = 60  # one whole `trainprof run` (upload deadline 20 s by default)
AGENT_UP_S = 15  # an agent writing its first lines
UPLOAD_S = 30  # a sealed file reaching S3 (a back-off is capped at 10 s)
SHUTDOWN_S = 30  # SIGTERM to exit, with the default upload deadline of 20 s
OUTAGE_S = 20  # how long the server is unreachable in the outage test
DROP_EVERY_S = 1.0  # one extra sealed file a second in the outage test
SHORT_DEADLINE_S = 5  # --upload-deadline-s where the server is down
DEADLINE_SLACK_S = 2  # allowed past it, for sealing and writing the markers
LIVE_TRAINER_S = 11  # the agent runs beside a live trainer this long without touching its file
REPAIR_S = 15  # a dead trainer's timeline repaired by the running agent (else at the next start)
# The agents of the SIGKILL test: how long each lives past its first lines, and whether it
# starts just after a second boundary. The last one dies at once, so that its successor's
# first line falls in the same second as its own: both first files want the same name.
KILLS = ((1.3, False), (2.7, False), (0.1, True))

INTERVAL = ("--interval-ms", "100")
MARKERS = ("system/training_job_end.ts", "framework/training_job_end.ts")
AGENT_SYSTEM_FILE = re.compile(r"^system/incremental/\d{10}/\d+\.algo-1\.json$")
# The agent's node record, once per start (docs/formats.md, "Node record").
NODE_RECORD = re.compile(r"^system/node/algo-1/\d{16}\.json$")
# The agent's own cost, written once when sampling ends (docs/formats.md, "The agent's own cost").
COST_RECORD = re.compile(r"^system/cost/algo-1/\d{16}\.json$")
TIMELINE_FILE = re.compile(r"^framework/pevents/(\d{10})/(\d+)_(.+)_pythontimeline\.json$")

UPLOADED_RE = re.compile(
    r"^trainprof: upload: (\d+) files? uploaded \((\d+) bytes\), (\d+) already in S3, (\d+) failed attempts?$", re.M
)
LEFT_RE = re.compile(r"^trainprof: upload: (\d+) files? left on local disk under (.+)$", re.M)
LAST_ERROR = "trainprof: upload: last error: "
REPAIRED_RE = re.compile(r"^trainprof: repaired (\d+) temporary files? \((\d+) records?\)$", re.M)

# Verbosity switches a user might set while debugging; none may make the secret show.
VERBOSE_ENV = {"RUST_LOG": "trace", "RUST_BACKTRACE": "full", "AWS_LOG_LEVEL": "trace", "TRAINPROF_LOG": "trace"}


# --------------------------------------------------------------------------- helpers


class Proc:
    """A process started by a test: stdout / stderr in files, its own session."""

    def __init__(self, argv, env, log_dir, name, cwd=None):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.out_path = log_dir / f"{name}.stdout"
        self.err_path = log_dir / f"{name}.stderr"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.popen = subprocess.Popen(
                self.argv, env=env, cwd=cwd or log_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True,
            )
        self.started = time.monotonic()

    @property
    def pid(self):
        return self.popen.pid

    @property
    def returncode(self):
        return self.popen.poll()

    def alive(self):
        return self.popen.poll() is None

    def stdout(self):
        return self.out_path.read_text(errors="replace")

    def stderr(self):
        return self.err_path.read_text(errors="replace")

    def wait(self, timeout):
        """Exit status; fails the test (after a SIGKILL) when it takes longer than ``timeout``."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            pytest.fail(f"{self.name} did not exit within {timeout} s; stderr:\n{self.stderr()[-4000:]}")

    def term(self, timeout=SHUTDOWN_S):
        """SIGTERM to the process alone (as a scheduler sends it); returns its exit status."""
        self.popen.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self):
        """SIGKILL to the process alone; waits for it."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def kill_group(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture
def hook_lib(trainprof_bin):
    """The hook library: TRAINPROF_HOOK_LIB (scripts/test sets it), else the one beside the binary."""
    path = pathlib.Path(os.environ.get("TRAINPROF_HOOK_LIB") or trainprof_bin.parent / "libtrainprof_hook.so")
    if not path.is_file():
        pytest.fail(f"{path} does not exist: build it first (`cargo build -p trainprof-hook`; scripts/test does)")
    return path.resolve()


@pytest.fixture
def procs(tmp_path):
    """``procs.start(argv, env, name)`` starts a Proc; every one still running at the end is
    SIGKILLed (whole session), and the outputs of all of them are checked for the secret."""

    class Procs(list):
        def start(self, argv, env, name=None):
            name = name or f"p{len(self) + 1}"
            p = Proc(argv, env, logs, name)
            self.append(p)
            return p

    logs = tmp_path / "logs"
    logs.mkdir()
    started = Procs()
    yield started
    for p in started:
        if p.alive():
            p.kill_group()
    assert_no_secret(*started)


def assert_no_secret(*procs):
    """The secret key shows in no process's stdout or stderr."""
    for p in procs:
        for stream, text in (("stdout", p.stdout()), ("stderr", p.stderr())):
            assert SECRET not in text, f"the secret key is in {p.name}'s {stream}"


def assert_no_secret_in_tree(root):
    """... nor in any file the agent wrote (its state under .trainprof/ included)."""
    for path in pathlib.Path(root).rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"the secret key is in {path}"


def wait_for(cond, timeout, what, alive=()):
    """Polls ``cond()`` until it is true (returns its value); fails after ``timeout`` s, or
    as soon as one of the processes ``alive`` has exited."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        for p in alive:
            if not p.alive():
                pytest.fail(f"{p.name} exited ({p.returncode}) while waiting for {what}; stderr:\n{p.stderr()[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


class Summary:
    """The upload lines of an agent's summary (each must be there exactly once)."""

    def __init__(self, stderr):
        up = UPLOADED_RE.findall(stderr)
        left = LEFT_RE.findall(stderr)
        assert len(up) == 1 and len(left) == 1, f"no single upload summary in stderr:\n{stderr[-4000:]}"
        self.uploaded, self.bytes, self.already, self.failed = map(int, up[0])
        self.left = int(left[0][0])
        self.left_dir = left[0][1]

    def __repr__(self):
        return repr(self.__dict__)


def repaired(stderr):
    """[(files, records)] of every `repaired` line."""
    return [tuple(map(int, m)) for m in REPAIRED_RE.findall(stderr)]


def is_temporary(rel):
    """What never goes to S3: `.tmp` names, hidden files and folders (`.tmp/`, `.trainprof/`)."""
    return rel.endswith(".tmp") or any(part.startswith(".") for part in rel.split("/"))


def sealed_files(root):
    """{relative path: bytes} of every sealed file under ``root``."""
    root = pathlib.Path(root)
    out = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not is_temporary(rel):
            out[rel] = path.read_bytes()
    return out


def temporary_files(root):
    """Relative paths of the temporary files under ``root``, the agent's own state aside."""
    root = pathlib.Path(root)
    return sorted(
        rel for path in root.rglob("*")
        if path.is_file() and is_temporary(rel := path.relative_to(root).as_posix())
        and not rel.startswith(".trainprof/")
    )


def under(prefix, rel):
    return f"{prefix}/{rel}"


def uploaded(s3, prefix):
    """{relative path: bytes} of every object under ``prefix``."""
    return {k[len(prefix) + 1:]: v for k, v in s3.objects(prefix + "/").items()}


def env_for(tmp_path, endpoint, **extra):
    """agent_env, plus no profiler config and no resourceconfig (so the node is algo-1)."""
    defaults = {
        "SMPROFILER_CONFIG_PATH": tmp_path / "no-profilerconfig.json",
        "TRAINPROF_RESOURCE_CONFIG": tmp_path / "no-resourceconfig.json",
    }
    return agent_env(endpoint, **{**defaults, **extra})


def upload_args(out, url, endpoint, *more):
    return [*INTERVAL, "--local-path", str(out), "--s3", url, "--s3-endpoint", endpoint, *more]


def trainer_env(env, tmp_path, hook_lib, params, name="trainer"):
    """``env`` plus what loop.py needs."""
    return {
        **env,
        "PYTHONPATH": str(PACKAGE_DIR),
        "PYTHONDONTWRITEBYTECODE": "1",
        "TRAINPROF_HOOK_LIB": str(hook_lib),
        "TRAINPROF_TEST_MANIFEST": str(tmp_path / f"{name}-manifest.json"),
        "TRAINPROF_TEST_PARAMS": json.dumps(params),
    }


def write_profiler_config(path, local_path, **params):
    path.write_text(json.dumps({"ProfilingParameters": {"LocalPath": str(local_path), **params}}))
    return path


def system_rows(node, epoch, n):
    return [
        {"Type": "cpu", "Name": "cpu0", "Dimension": "CPUUtilization", "Value": round(epoch % 97 + j / 10, 2),
         "NodeId": node, "Timestamp": epoch + j / 10}
        for j in range(n)
    ]


def drop_system_file(root, staging, epoch, node="algo-9", rows=10):
    """Puts a sealed system file for ``node`` named by ``epoch`` into the tree, as a writer
    seals one (written aside, then renamed into place); returns its relative path."""
    hour = time.strftime("%Y%m%d%H", time.gmtime(epoch))
    rel = f"system/incremental/{hour}/{epoch}.{node}.json"
    body = "".join(json.dumps(r) + "\n" for r in system_rows(node, epoch, rows)).encode()
    staging.mkdir(parents=True, exist_ok=True)
    aside = staging / f"{epoch}.{node}"
    with open(aside, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    dest = pathlib.Path(root) / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    assert not dest.exists(), dest
    os.rename(aside, dest)
    return rel


def record_id(rec, node=None):
    return (rec.get("NodeId", node), rec["Timestamp"], rec["Type"], rec["Name"], rec["Dimension"])


def json_lines(body, what):
    """The records of a system file: every line a JSON object, the last one ended too."""
    text = body.decode()
    assert text.endswith("\n"), f"{what} does not end with a newline"
    out = []
    for n, line in enumerate(text.split("\n")[:-1], 1):
        try:
            rec = json.loads(line)
        except ValueError:
            pytest.fail(f"{what} line {n} is not JSON: {line[:200]!r}")
        assert isinstance(rec, dict), (what, n, line[:200])
        out.append(rec)
    return out


def complete_lines(path):
    """The complete (newline-ended, JSON) lines of a file being written, as records."""
    try:
        text = pathlib.Path(path).read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for line in text.split("\n")[:-1]:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def timeline_records(path):
    """The complete records of a timeline file being written (``[`` then one record a
    line, separated by commas; the last one may be cut short)."""
    try:
        lines = pathlib.Path(path).read_bytes().decode(errors="replace").split("\n")
    except FileNotFoundError:
        return []
    assert lines[0] == "[", lines[:1]
    out = []
    for line in lines[1:]:
        try:
            out.append(json.loads(line.rstrip().rstrip(",")))
        except ValueError:
            pass
    return out


def put_log(s3):
    """[(key, status)] of every PUT / POST the server answered, in order (its request log)."""
    pat = re.compile(r'"(?:PUT|POST) /' + re.escape(s3.bucket) + r'/([^ ?"]+)[^ "]* HTTP/1\.[01]" (\d{3})')
    return [(urllib.parse.unquote(m.group(1)), int(m.group(2))) for m in pat.finditer(s3.log())]


def system_event_key(e):
    return (e.timestamp, e.type, e.name, e.dimension, e.value, e.node_id)


def algorithm_event_key(e):
    return (e.event_phase, e.event_name, e.start_time, e.end_time, e.node_id, json.dumps(e.event_args, sort_keys=True))


# --------------------------------------------------------------------------- tests


def test_run_uploads_every_file_byte_for_byte_and_smdebug_reads_s3(
        trainprof_bin, hook_lib, s3, smdebug_s3, procs, tmp_path):
    """a. `trainprof run --keep-local` around a trainer: every sealed file (system,
    timelines, markers) is in S3 with the same bytes, nothing temporary is, the markers
    went last, and smdebug's S3 readers read what its local readers read."""
    from smdebug.profiler.algorithm_metrics_reader import LocalAlgorithmMetricsReader, S3AlgorithmMetricsReader
    from smdebug.profiler.system_metrics_reader import LocalSystemMetricsReader, S3SystemMetricsReader

    out = tmp_path / "out"
    prefix = "jobs/run-a"
    config = write_profiler_config(tmp_path / "profilerconfig.json", out, RotateMaxFileSizeInBytes=2000)
    env = trainer_env(env_for(tmp_path, s3.endpoint, SMPROFILER_CONFIG_PATH=config), tmp_path, hook_lib,
                      {"phases": [["train", 20], ["eval", 5]], "work_ms": 20})
    run = procs.start([trainprof_bin, "run", *upload_args(out, s3.url(prefix), s3.endpoint, "--keep-local"),
                       "--", sys.executable, LOOP], env, "run")
    assert run.wait(RUN_TIMEOUT_S) == 0, run.stderr()
    stderr = run.stderr()

    local = sealed_files(out)
    timelines = [r for r in local if TIMELINE_FILE.match(r)]
    assert all(m in local for m in MARKERS), sorted(local)
    assert any(AGENT_SYSTEM_FILE.match(r) for r in local), sorted(local)
    assert len(timelines) >= 3, sorted(local)  # rotated at 2000 bytes
    assert temporary_files(out) == []

    # Every sealed file, byte for byte, and nothing else.
    keys = s3.keys(prefix + "/")
    assert not [k for k in keys if is_temporary(k)], keys
    remote = uploaded(s3, prefix)
    assert sorted(remote) == sorted(local)
    for rel, body in local.items():
        assert remote[rel] == body, f"{rel}: S3 holds {len(remote[rel])} bytes, the disk {len(body)}"

    # The end-of-run page is sent by `run` itself once the uploader is done (docs/report.md,
    # "At the end of trainprof run"); the uploader sent the rest.
    data = {rel: body for rel, body in local.items() if rel != "report.html"}
    assert len(data) == len(local) - 1, sorted(local)
    s = Summary(stderr)
    assert (s.uploaded, s.bytes, s.already, s.failed) == (len(data), sum(map(len, data.values())), 0, 0), s
    assert s.left == 0, s  # kept, but not waiting: "left" counts what S3 does not have
    # --keep-local: the files stay, and the agent records which are in S3.
    record = out / ".trainprof" / "uploaded"
    assert record.is_file(), sorted(str(p.relative_to(out)) for p in out.glob(".trainprof/*"))
    text = record.read_text(errors="replace")
    assert all(rel in text for rel in data), text[:2000]

    # The markers went last: the server confirmed every data file before a marker arrived;
    # the page came after them all.
    puts = [k[len(prefix) + 1:] for k, status in put_log(s3) if status == 200 and k.startswith(prefix + "/")]
    assert puts[-1] == "report.html", puts
    first_marker = min(i for i, rel in enumerate(puts) if rel in MARKERS)
    last_data = max(i for i, rel in enumerate(puts[:-1]) if rel not in MARKERS)
    assert last_data < first_marker, puts

    # smdebug reads from S3 exactly what it reads from the disk.
    wide = (0, 10**18)
    s3_sys = S3SystemMetricsReader(s3.url(prefix)).get_events(*wide)
    local_sys = LocalSystemMetricsReader(str(out)).get_events(*wide)
    assert local_sys and collections.Counter(map(system_event_key, s3_sys)) == collections.Counter(
        map(system_event_key, local_sys))
    s3_alg = S3AlgorithmMetricsReader(s3.url(prefix)).get_events(*wide)
    local_alg = LocalAlgorithmMetricsReader(str(out)).get_events(*wide)
    manifest = json.loads(pathlib.Path(env["TRAINPROF_TEST_MANIFEST"]).read_text())
    assert len(local_alg) == len(manifest["events"])
    assert collections.Counter(map(algorithm_event_key, s3_alg)) == collections.Counter(
        map(algorithm_event_key, local_alg))

    assert_no_secret(run)
    assert_no_secret_in_tree(out)


def test_run_without_keep_local_leaves_nothing_on_disk(trainprof_bin, s3, procs, tmp_path):
    """b. Without --keep-local every sealed file is deleted once S3 has it."""
    out = tmp_path / "out"
    prefix = "jobs/run-b"
    run = procs.start([trainprof_bin, "run", *upload_args(out, s3.url(prefix), s3.endpoint),
                       "--", sys.executable, "-c", "import time; time.sleep(2)"],
                      env_for(tmp_path, s3.endpoint), "run")
    assert run.wait(RUN_TIMEOUT_S) == 0, run.stderr()
    stderr = run.stderr()

    assert sealed_files(out) == {}, sorted(sealed_files(out))
    assert temporary_files(out) == []
    remote = uploaded(s3, prefix)
    # The end-of-run page, made from S3 after the upload and sent by itself (docs/report.md,
    # "At the end of trainprof run"; tests/s3/test_report_upload.py): not the uploader's.
    assert "report.html" in remote, sorted(remote)
    del remote["report.html"]
    assert all(m in remote for m in MARKERS), sorted(remote)
    system = [r for r in remote if AGENT_SYSTEM_FILE.match(r)]
    records = [r for r in remote if NODE_RECORD.match(r)]
    costs = [r for r in remote if COST_RECORD.match(r)]
    assert system and len(records) == 1 and len(costs) == 1, sorted(remote)
    assert sorted(remote) == sorted([*MARKERS, *system, *records, *costs]), sorted(remote)
    for rel in system:
        assert len(json_lines(remote[rel], rel)) >= 10  # 2 s at 100 ms, many rows a tick

    s = Summary(stderr)
    assert (s.uploaded, s.bytes, s.already, s.failed) == (len(remote), sum(map(len, remote.values())), 0, 0), s
    assert s.left == 0, s
    assert pathlib.Path(s.left_dir).resolve() == out.resolve(), s
    assert_no_secret(run)
    assert_no_secret_in_tree(out)


def test_outage_loses_and_duplicates_nothing(trainprof_bin, s3, proxy, procs, tmp_path):
    """c. The server goes away for OUTAGE_S while files keep being sealed (the agent's own
    and one dropped into the tree every second), then comes back: every file arrives once,
    the local copies stay until then, and no row is in two objects."""
    out = tmp_path / "out"
    staging = tmp_path / "staging"
    prefix = "jobs/outage"
    agent = procs.start([trainprof_bin, "agent", *upload_args(out, s3.url(prefix), proxy.endpoint)],
                        env_for(tmp_path, proxy.endpoint), "agent")
    base = int(time.time()) - 7200  # names of another node, two hours back: no clash with the agent's
    dropped = []

    def drop(n):
        for _ in range(n):
            dropped.append(drop_system_file(out, staging, base + len(dropped)))
            time.sleep(DROP_EVERY_S)

    def in_s3(rels):
        keys = set(s3.keys(prefix + "/"))
        return all(under(prefix, r) in keys for r in rels)

    drop(5)
    wait_for(lambda: in_s3(dropped), UPLOAD_S, "the first files in S3", alive=[agent])
    before = len(dropped)

    proxy.stop()
    t_stop = time.monotonic()
    while time.monotonic() - t_stop < OUTAGE_S:
        drop(1)
        assert agent.alive(), agent.stderr()
    during = dropped[before:]
    # Nothing sent while it was down, and nothing deleted that S3 had not confirmed.
    keys = set(s3.keys(prefix + "/"))
    assert not [r for r in during if under(prefix, r) in keys]
    on_disk = sealed_files(out)
    assert all(r in on_disk for r in during), sorted(set(during) - set(on_disk))

    proxy.start()
    drop(5)
    wait_for(lambda: in_s3(dropped), UPLOAD_S, "every dropped file in S3 after the outage", alive=[agent])
    assert agent.term() == 0, agent.stderr()
    stderr = agent.stderr()

    remote = uploaded(s3, prefix)
    own = sorted(set(remote) - set(dropped))
    assert all(m in own for m in MARKERS), own
    assert all(AGENT_SYSTEM_FILE.match(r) or NODE_RECORD.match(r) or COST_RECORD.match(r) or r in MARKERS
               for r in own), own
    assert any(AGENT_SYSTEM_FILE.match(r) for r in own), own
    assert sealed_files(out) == {}, sorted(sealed_files(out))
    assert temporary_files(out) == []
    for rel in dropped:
        assert json_lines(remote[rel], rel) == system_rows("algo-9", int(rel.split("/")[-1].split(".")[0]), 10), rel

    # None twice: no two data objects alike (the two markers hold the same time), no system
    # row in two objects (or twice in one).
    data = {rel: body for rel, body in remote.items() if rel not in MARKERS}
    bodies = collections.Counter(data.values())
    assert not [rel for rel, b in data.items() if bodies[b] > 1]
    rows = collections.Counter()
    for rel, body in remote.items():
        if rel.startswith("system/incremental/"):
            rows.update(record_id(r) for r in json_lines(body, rel))
    assert not [r for r, n in rows.items() if n > 1][:5]

    s = Summary(stderr)
    assert s.uploaded + s.already == len(remote), (s, len(remote))
    assert s.failed >= 1, s  # files were waiting while it was down
    assert s.left == 0, s
    assert_no_secret(agent)
    assert_no_secret_in_tree(out)


def test_sigkilled_agents_lose_no_record(trainprof_bin, s3, procs, tmp_path):
    """d. `trainprof agent` SIGKILLed three times and restarted on the same LocalPath, then
    SIGTERMed: every complete record that was on disk at a kill (in the dead agent's
    temporary file or a sealed file not yet uploaded) ends up in S3, once, in valid JSON
    lines; each restart says what it repaired."""
    out = tmp_path / "out"
    prefix = "jobs/killed"
    env = env_for(tmp_path, s3.endpoint)
    args = [trainprof_bin, "agent", *upload_args(out, s3.url(prefix), s3.endpoint)]

    def own_tmp(pid):
        return sorted((out / "system").glob(f".*.{pid}.tmp"))

    def lines_of(pid):
        return sum(len(complete_lines(p)) for p in own_tmp(pid))

    expected = {}  # record id -> record
    agents = []
    tmp_records = []  # per kill: (temporary files, complete records in them)
    for round_, (after, aligned) in enumerate(KILLS):
        if aligned:
            time.sleep(1.02 - time.time() % 1)
        agent = procs.start(args, env, f"agent{round_ + 1}")
        agents.append(agent)
        wait_for(lambda: lines_of(agent.pid) >= 5, AGENT_UP_S, f"agent {round_ + 1}'s first lines", alive=[agent])
        time.sleep(after)
        agent.kill()
        tmps = sorted((out / "system").glob(".*.tmp"))
        recs = [r for p in tmps for r in complete_lines(p)]
        tmp_records.append((len(tmps), len(recs)))
        for rel, body in sealed_files(out).items():
            if rel.startswith("system/incremental/"):
                recs.extend(json_lines(body, rel))
        assert recs
        for r in recs:
            expected[record_id(r)] = r

    last = procs.start(args, env, "agent4")
    wait_for(lambda: lines_of(last.pid) >= 5, AGENT_UP_S, "the last agent's first lines", alive=[last])
    # Stopped once it has repaired what the killed agent before it left (it uploads that
    # before it exits).
    wait_for(lambda: repaired(last.stderr()), UPLOAD_S, "the last agent's repair", alive=[last])
    assert last.term() == 0, last.stderr()

    # Every restarted agent repaired what the killed one left.
    for agent, (files, records) in zip([*agents[1:], last], tmp_records):
        assert repaired(agent.stderr()) == [(files, records)], agent.stderr()[-3000:]

    remote = uploaded(s3, prefix)
    assert all(m in remote for m in MARKERS), sorted(remote)
    # One node record per agent started.
    assert len([r for r in remote if NODE_RECORD.match(r)]) == len(agents) + 1, sorted(remote)
    # The agents killed wrote no cost record; the last one, which ended, did.
    assert len([r for r in remote if COST_RECORD.match(r)]) >= 1, sorted(remote)
    seen = collections.Counter()
    got = {}
    for rel, body in remote.items():
        if rel in MARKERS or NODE_RECORD.match(rel) or COST_RECORD.match(rel):
            continue
        assert rel.startswith("system/incremental/") and rel.endswith(".json") and not is_temporary(rel), rel
        for r in json_lines(body, rel):
            seen[record_id(r)] += 1
            got[record_id(r)] = r
    assert not [k for k, n in seen.items() if n > 1][:5]
    missing = [k for k in expected if k not in got]
    assert not missing, f"{len(missing)} of {len(expected)} records never reached S3, e.g. {missing[:3]}"
    assert all(got[k] == expected[k] for k in expected)
    # ... and so did the last agent's own file, though the killed agent before it started
    # in the same second (and its file, repaired, took that second's name in S3 first).
    left = sorted(sealed_files(out))
    said = "\n".join(line for line in last.stderr().splitlines() if "s3://" in line or "upload" in line)
    assert left == [], f"left on disk: {left}; the last agent said:\n{said}"
    assert temporary_files(out) == []
    s = Summary(last.stderr())
    assert s.left == 0, s
    assert_no_secret(*procs)
    assert_no_secret_in_tree(out)


def test_sigkilled_trainer_timeline_is_repaired_and_uploaded(trainprof_bin, hook_lib, s3, smdebug_s3, procs, tmp_path):
    """d. A trainer SIGKILLed beside a standalone agent leaves its timeline as a temporary
    file; the agent leaves it alone while the trainer lives, then repairs it (while it
    runs, or at its next start) into a timeline that S3 gets and smdebug reads."""
    from smdebug.profiler.algorithm_metrics_reader import S3AlgorithmMetricsReader

    out = tmp_path / "out"
    prefix = "jobs/trainer-killed"
    env = env_for(tmp_path, s3.endpoint)
    args = [trainprof_bin, "agent", *upload_args(out, s3.url(prefix), s3.endpoint)]
    agent = procs.start(args, env, "agent")

    # Never sealed by the trainer itself: one file, open for the whole run.
    config = write_profiler_config(tmp_path / "profilerconfig.json", out, RotateFileCloseIntervalInSeconds=3600)
    tenv = trainer_env({**env, "SMPROFILER_CONFIG_PATH": str(config)}, tmp_path, hook_lib,
                       {"phases": [["train", 10**7]], "work_ms": 5})
    trainer = procs.start([sys.executable, LOOP], tenv, "trainer")

    def tmp_timelines():
        return sorted((out / "framework").glob("*_pythontimeline.json*.tmp"))

    wait_for(lambda: any(len(timeline_records(p)) >= 20 for p in tmp_timelines()), AGENT_UP_S,
             "the trainer's first events", alive=[agent, trainer])
    (tmp,) = tmp_timelines()
    t_live = time.monotonic()
    sizes = []
    while time.monotonic() - t_live < LIVE_TRAINER_S:
        assert trainer.alive(), trainer.stderr()
        assert tmp.is_file(), "the agent took a live trainer's timeline"
        sizes.append(tmp.stat().st_size)
        time.sleep(0.5)
    # Left alone: it only grew, and no timeline reached S3.
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0], sizes
    assert not [k for k in s3.keys(prefix + "/framework/") if "pevents" in k]

    trainer.kill()
    records = timeline_records(tmp)
    events = [r for r in records if r.get("ph") == "X"]
    assert len(events) >= 20

    def timeline_in_s3():
        return [k for k in s3.keys(prefix + "/framework/pevents/") if k.endswith("_pythontimeline.json")]

    deadline = time.monotonic() + REPAIR_S
    while not timeline_in_s3() and time.monotonic() < deadline:
        assert agent.alive(), agent.stderr()
        time.sleep(0.2)
    agents = [agent]
    if not timeline_in_s3():  # not repaired while running: the next start must do it
        assert agent.term() == 0, agent.stderr()
        agent = procs.start(args, env, "agent-restarted")
        agents.append(agent)
        wait_for(timeline_in_s3, UPLOAD_S, "the repaired timeline in S3", alive=[agent])
    assert agent.term() == 0, agent.stderr()
    # The repair was said, once, with the records it kept (metadata lines counted or not).
    said = [r for a in agents for r in repaired(a.stderr())]
    assert len(said) == 1 and said[0][0] == 1 and said[0][1] in (len(records), len(events)), \
        (said, len(records), len(events))

    (key,) = timeline_in_s3()
    rel = key[len(prefix) + 1:]
    m = TIMELINE_FILE.match(rel)
    assert m, rel
    hour, end_us, node = m.group(1), int(m.group(2)), m.group(3)
    assert node.startswith(f"{trainer.pid}-"), (node, trainer.pid)
    doc = json.loads(s3.get(key))
    assert isinstance(doc, list)
    assert doc == records, "the repaired timeline is not the records the trainer wrote"
    base = doc[0]["args"]["start_time_since_epoch_in_micros"]
    assert end_us >= max(base + e["ts"] + e["dur"] for e in events)
    assert hour == time.strftime("%Y%m%d%H", time.gmtime(end_us / 1e6))
    assert not tmp.exists() and temporary_files(out) == []

    read = S3AlgorithmMetricsReader(s3.url(prefix)).get_events(0, 10**18)
    assert len(read) == len(events)
    assert {e.event_name for e in read} == {e["name"] for e in events}
    assert all(e.node_id == node for e in read)
    assert_no_secret(*procs)


def test_sigterm_while_server_is_down_keeps_files_within_the_deadline(trainprof_bin, s3, proxy, procs, tmp_path):
    """e. SIGTERM while the server cannot be reached: the agent gives up after
    --upload-deadline-s, keeps every file sealed on disk and says how many; the next agent,
    with the server back, uploads them."""
    out = tmp_path / "out"
    prefix = "jobs/down"
    env = env_for(tmp_path, proxy.endpoint)
    args = [trainprof_bin, "agent",
            *upload_args(out, s3.url(prefix), proxy.endpoint, "--upload-deadline-s", str(SHORT_DEADLINE_S))]
    proxy.stop()
    agent = procs.start(args, env, "agent")
    dropped = {}
    for i in range(5):
        rel = drop_system_file(out, tmp_path / "staging", int(time.time()) - 7200 + i)
        dropped[rel] = (out / rel).read_bytes()
    wait_for(lambda: list((out / "system").glob(f".*.{agent.pid}.tmp")), AGENT_UP_S, "the agent's first lines",
             alive=[agent])
    # An attempt has failed (and is said) before the SIGTERM.
    wait_for(lambda: "refused" in agent.stderr().lower(), UPLOAD_S, "the first refused attempt", alive=[agent])

    t0 = time.monotonic()
    rc = agent.term(SHORT_DEADLINE_S + DEADLINE_SLACK_S + 10)
    took = time.monotonic() - t0
    assert took <= SHORT_DEADLINE_S + DEADLINE_SLACK_S, f"{took:.1f} s to exit; stderr:\n{agent.stderr()[-3000:]}"
    assert rc is not None and rc >= 0, rc  # it exited on its own, not by a signal

    local = sealed_files(out)
    assert all(local.get(rel) == body for rel, body in dropped.items())
    assert all(m in local for m in MARKERS), sorted(local)
    assert any(AGENT_SYSTEM_FILE.match(r) for r in local), sorted(local)
    assert temporary_files(out) == []  # the agent's own file sealed, not left temporary
    s = Summary(agent.stderr())
    assert s.left == len(local) > 0, (s, sorted(local))
    assert pathlib.Path(s.left_dir).resolve() == out.resolve(), s
    assert s.uploaded == 0 and s.failed >= 2, s
    assert s3.keys(prefix + "/") == []
    # The failure is said once while it lasts, not once per attempt (the summary's `last
    # error:` line may name it again).
    said = [line for line in agent.stderr().splitlines()
            if "refused" in line.lower() and not line.startswith(LAST_ERROR)]
    assert len(said) == 1, said

    # The server is back: the next agent uploads what was left.
    proxy.start()
    agent2 = procs.start(args, env, "agent2")
    # (The markers wait for the end of the agent that uploads them.)
    left_data = [r for r in local if r not in MARKERS]
    wait_for(lambda: all(under(prefix, r) in set(s3.keys(prefix + "/")) for r in left_data), UPLOAD_S,
             "the files left behind in S3", alive=[agent2])
    assert agent2.term() == 0, agent2.stderr()
    remote = uploaded(s3, prefix)
    for rel in left_data:  # (the second agent writes markers of its own)
        assert remote[rel] == local[rel], rel
    assert all(m in remote for m in MARKERS), sorted(remote)
    assert Summary(agent2.stderr()).left == 0
    assert_no_secret(agent, agent2)
    assert_no_secret_in_tree(out)


def test_secret_never_logged_even_verbose_and_errors_said_once(trainprof_bin, s3, procs, tmp_path):
    """f. A bucket that does not exist, with every verbosity switch on: the error is named
    once (not per attempt), the files stay, and the secret key shows nowhere."""
    out = tmp_path / "out"
    missing = "trainprof-no-such-bucket"
    url = f"s3://{missing}/jobs/f"
    env = env_for(tmp_path, s3.endpoint, **VERBOSE_ENV)
    agent = procs.start([trainprof_bin, "agent",
                         *upload_args(out, url, s3.endpoint, "--upload-deadline-s", str(SHORT_DEADLINE_S))],
                        env, "agent")
    for i in range(8):  # several files, several seconds: several attempts
        drop_system_file(out, tmp_path / "staging", int(time.time()) - 7200 + i)
        time.sleep(0.5)
    wait_for(lambda: list((out / "system").glob(f".*.{agent.pid}.tmp")), AGENT_UP_S, "the agent's first lines",
             alive=[agent])
    # An attempt has failed (and is said) before the SIGTERM.
    wait_for(lambda: "NoSuchBucket" in agent.stderr(), UPLOAD_S, "the first failed attempt", alive=[agent])
    agent.term(SHORT_DEADLINE_S + DEADLINE_SLACK_S + 10)
    stderr = agent.stderr()

    assert SECRET not in stderr and SECRET not in agent.stdout()
    # Named once while it runs (the summary's `last error:` line may name it again).
    said = [line for line in stderr.splitlines()
            if "NoSuchBucket" in line and not line.startswith(LAST_ERROR)]
    assert len(said) == 1, said or stderr[-3000:]
    s = Summary(stderr)
    assert s.uploaded == 0 and s.failed >= 1, s
    assert s.left == len(sealed_files(out)) >= 8, s
    assert [b["Name"] for b in s3.client.list_buckets()["Buckets"]] == [s3.bucket]  # it created no bucket
    assert_no_secret(agent)
    assert_no_secret_in_tree(out)


def test_a_large_file_goes_up_in_parts_with_the_same_bytes(trainprof_bin, s3, procs, tmp_path):
    """A file above the multipart threshold (lowered here) arrives whole: same bytes, and
    the ETag of a multipart upload (`<md5 of md5s>-<parts>`)."""
    out = tmp_path / "out"
    prefix = "jobs/multipart"
    rel = "framework/pevents/2020072013/1595253601000000_0-algo-1_pythontimeline.json"
    body = os.urandom(13_000_000)
    (out / rel).parent.mkdir(parents=True)
    (out / rel).write_bytes(body)
    run = procs.start([trainprof_bin, "run", *upload_args(out, s3.url(prefix), s3.endpoint,
                                                          "--s3-multipart-bytes", "6000000"),
                       "--", sys.executable, "-c", "pass"], env_for(tmp_path, s3.endpoint), "run")
    assert run.wait(RUN_TIMEOUT_S) == 0, run.stderr()
    key = under(prefix, rel)
    assert s3.get(key) == body
    etag = s3.client.head_object(Bucket=s3.bucket, Key=key)["ETag"].strip('"')
    assert etag.endswith("-2"), etag  # 8 MiB + the rest
    assert not (out / rel).exists()
    assert Summary(run.stderr()).left == 0


def test_a_flaky_server_is_logged_once_per_30_s_not_per_change(trainprof_bin, s3, proxy, procs, tmp_path):
    """The server goes away and comes back every 0.6 s for 12 s while files keep coming:
    the store's state is said at once when it first fails, and then at most once per 30 s
    (docs/run.md, "Upload to S3"), not once per change; every file arrives all the same."""
    out = tmp_path / "out"
    staging = tmp_path / "staging"
    prefix = "jobs/flaky"
    agent = procs.start([trainprof_bin, "agent", *upload_args(out, s3.url(prefix), proxy.endpoint)],
                        env_for(tmp_path, proxy.endpoint), "agent")
    base = int(time.time()) - 7200
    dropped = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 12:
        proxy.stop()
        dropped.append(drop_system_file(out, staging, base + len(dropped)))
        time.sleep(0.6)
        proxy.start()
        time.sleep(0.6)
        assert agent.alive(), agent.stderr()
    wait_for(lambda: all(under(prefix, r) in set(s3.keys(prefix + "/")) for r in dropped), UPLOAD_S,
             "every file in S3 after the flapping", alive=[agent])
    assert agent.term() == 0, agent.stderr()
    stderr = agent.stderr()
    state = [line for line in stderr.splitlines() if " failing (" in line or "reachable again" in line]
    assert 1 <= len(state) <= 2, state
    assert Summary(stderr).failed >= 2, stderr[-2000:]
    assert_no_secret(agent)


def test_a_file_that_keeps_growing_cannot_hold_the_end_up(trainprof_bin, s3, tmp_path):
    """A trainer leaves a writer behind that keeps appending to a sealed-looking timeline (kept
    on disk: --keep-local): the uploader sends the length it saw at open (the longer file a
    later walk sees is not sent over it), `run` still ends within the deadline plus a few seconds with the command's status,
    and the markers go up."""
    out = tmp_path / "out"
    prefix = "jobs/growing"
    hour = out / "framework" / "pevents" / "2026010100"
    grown = hour / "1767225600000000_0-algo-1_pythontimeline.json"
    pidfile = tmp_path / "writer.pid"
    line = '{"name": "x", "ph": "X", "ts": 1767225600000000, "dur": 1, "pid": 1, "tid": 1},'
    script = (f"mkdir -p {hour}; printf '[\\n' > {grown}; "
              f"(while :; do echo '{line}' >> {grown}; done) </dev/null >/dev/null 2>&1 & "
              f"echo $! > {pidfile}; sleep 1.5; exit 5")
    started = time.monotonic()
    proc = subprocess.run([str(trainprof_bin), "run", *upload_args(out, s3.url(prefix), s3.endpoint, "--keep-local"),
                           "--upload-deadline-s", "3", "--", "sh", "-c", script],
                          env=env_for(tmp_path, s3.endpoint), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    took = time.monotonic() - started
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert proc.returncode == 5, proc.stderr
    remote = uploaded(s3, prefix)
    assert all(m in remote for m in MARKERS), sorted(remote)
    rel = str(grown.relative_to(out))
    sent = remote[rel]
    assert grown.read_bytes()[:len(sent)] == sent and len(sent) < grown.stat().st_size
    assert took < 30, took


def test_a_sparse_file_is_refused_not_sent(trainprof_bin, s3, tmp_path):
    """A trainer plants a 20 GB file of holes (20 KB on disk) among the timelines: the
    uploader refuses it with one line (it is never read, so it cannot eat the deadline), the
    rest goes up, the markers too, and `run` keeps the command's status."""
    out = tmp_path / "out"
    prefix = "jobs/sparse"
    hour = out / "framework" / "pevents" / "2026010100"
    sparse = hour / "1767225600000000_0-algo-1_pythontimeline.json"
    script = f"mkdir -p {hour}; truncate -s 20G {sparse}; exit 6"
    started = time.monotonic()
    proc = subprocess.run([str(trainprof_bin), "run", *upload_args(out, s3.url(prefix), s3.endpoint, "--keep-local"),
                           "--upload-deadline-s", "20", "--", "sh", "-c", script],
                          env=env_for(tmp_path, s3.endpoint), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    took = time.monotonic() - started
    assert proc.returncode == 6, proc.stderr
    remote = uploaded(s3, prefix)
    assert all(m in remote for m in MARKERS), sorted(remote)
    assert str(sparse.relative_to(out)) not in remote
    assert "mostly holes" in proc.stderr, proc.stderr
    assert sparse.stat().st_size == 20 << 30  # kept, not deleted: not ours
    assert took < 30, took
