"""A trainer's user plants links under LocalPath for the agent (root) to follow
(docs/on-disk.md): a linked `framework/`, a link at an end marker's name, a linked
`.trainprof/`, a linked hour folder full of files, a FIFO with a sealed file's name, a
hard link to a file elsewhere. `trainprof run --s3` against moto must upload nothing from
behind them, delete nothing it did not seal, write through none of them, say what it left
alone, and still upload its own files and exit with the trainer's status."""

import os
import pathlib
import sys

from test_upload import RUN_TIMEOUT_S, env_for, procs, upload_args, uploaded  # noqa: F401  (fixture)

MARKERS = ("system/training_job_end.ts", "framework/training_job_end.ts")


def secret_tree(tmp_path):
    """A root-only folder with one file, and a standalone root-only file."""
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (secret / "1595253600000000_0-x_pythontimeline.json").write_bytes(b"root only")
    os.chmod(secret / "1595253600000000_0-x_pythontimeline.json", 0o600)
    key = tmp_path / "key"
    key.write_bytes(b"root only key")
    os.chmod(key, 0o600)
    return secret, key


def snapshot(*paths):
    out = {}
    for p in paths:
        p = pathlib.Path(p)
        items = [p] if p.is_file() else sorted(p.rglob("*"))
        for f in items:
            if f.is_file():
                out[str(f)] = (f.read_bytes(), f.stat().st_mode, f.stat().st_nlink)
    return out


def test_planted_links_are_left_alone_and_named(trainprof_bin, s3, procs, tmp_path):  # noqa: F811
    secret, key = secret_tree(tmp_path)
    out = tmp_path / "out"
    (out / "system").mkdir(parents=True)
    (out / "framework" / "pevents").mkdir(parents=True)
    # A link at an end marker's name, and one for the agent's records.
    os.symlink(key, out / MARKERS[0])
    os.symlink(secret, out / ".trainprof")
    # A linked hour folder and a linked file among the sealed names.
    os.symlink(secret, out / "framework" / "pevents" / "2020072013")
    hour = out / "framework" / "pevents" / "2020072014"
    hour.mkdir()
    os.symlink(key, hour / "1595257200000001_0-x_pythontimeline.json")
    # A FIFO with a sealed file's name: a reader that opens it without O_NONBLOCK hangs.
    os.mkfifo(hour / "1595257200000002_0-x_pythontimeline.json")
    # A second hard link to a file outside: not ours to send or delete.
    os.link(key, hour / "1595257200000003_0-x_pythontimeline.json")
    # And one real file of the trainer's, which is uploaded and deleted as usual.
    real = hour / "1595257200000004_0-x_pythontimeline.json"
    real.write_bytes(b"[\n]")
    before = snapshot(secret, key)

    prefix = "jobs/planted"
    run = procs.start([trainprof_bin, "run", *upload_args(out, s3.url(prefix), s3.endpoint),
                       "--", sys.executable, "-c", "import sys, time; time.sleep(1); sys.exit(3)"],
                      env_for(tmp_path, s3.endpoint), "run")
    assert run.wait(RUN_TIMEOUT_S) == 3, run.stderr()
    stderr = run.stderr()

    assert snapshot(secret, key) == before, "the targets of the links are untouched"
    remote = uploaded(s3, prefix)
    assert b"root only" not in b"".join(remote.values())
    assert not any("2020072013" in r or r.endswith(("0000001_0-x_pythontimeline.json",
                                                     "0000002_0-x_pythontimeline.json",
                                                     "0000003_0-x_pythontimeline.json")) for r in remote), sorted(remote)
    assert remote["framework/pevents/2020072014/1595257200000004_0-x_pythontimeline.json"] == b"[\n]"
    assert not real.exists()
    assert any(r.startswith("system/incremental/") for r in remote), sorted(remote)
    # The marker link was replaced by a marker (a rename replaces the link, not its
    # target), which went up last and was deleted like any sent file.
    assert all(float(remote[m]) > 1e9 for m in MARKERS), sorted(remote)
    assert not os.path.lexists(out / MARKERS[0])
    # What was left alone is named, once each.
    for what in ("2020072013 is a symbolic link (not followed)",
                 "1595257200000001_0-x_pythontimeline.json is a symbolic link (not followed)",
                 "1595257200000002_0-x_pythontimeline.json is not a regular file",
                 "1595257200000003_0-x_pythontimeline.json has 2 hard links",
                 ".trainprof is a symbolic link (not followed)"):
        lines = [line for line in stderr.splitlines() if what in line]
        assert len(lines) == 1, (what, stderr[-4000:])
    # The links and the FIFO are still there: nothing the agent did not seal is deleted.
    assert (out / "framework" / "pevents" / "2020072013").is_symlink()
    assert (hour / "1595257200000001_0-x_pythontimeline.json").is_symlink()
    assert (hour / "1595257200000002_0-x_pythontimeline.json").exists()
    assert (hour / "1595257200000003_0-x_pythontimeline.json").exists()


def test_a_linked_framework_folder_is_never_walked(trainprof_bin, s3, procs, tmp_path):  # noqa: F811
    secret, key = secret_tree(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(secret, out / "framework")
    before = snapshot(secret, key)
    prefix = "jobs/linked-framework"
    run = procs.start([trainprof_bin, "run", *upload_args(out, s3.url(prefix), s3.endpoint),
                       "--", sys.executable, "-c", "pass"], env_for(tmp_path, s3.endpoint), "run")
    assert run.wait(RUN_TIMEOUT_S) == 0, run.stderr()
    assert snapshot(secret, key) == before
    remote = uploaded(s3, prefix)
    assert not any(r.startswith("framework/") and r != MARKERS[1] for r in remote), sorted(remote)
    assert b"root only" not in b"".join(remote.values())
    assert "framework is a symbolic link (not followed)" in run.stderr(), run.stderr()[-4000:]
    assert any(r.startswith("system/incremental/") for r in remote), sorted(remote)
