"""``trainprof._seal``: what the package writes takes its final name without replacing
anything there (docs/on-disk.md, "Nothing is replaced"), and the Python-profiling windows
and the Keras adapter go through it. Run in the test process (no library needed)."""

import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "hook-ffi" / "python"))

from trainprof import _lib, _python_profiling, _seal, keras  # noqa: E402


@pytest.fixture(params=["renameat2", "fallback"])
def how(request, monkeypatch):
    """Each test with renameat2(RENAME_NOREPLACE), and with the fallbacks used where it is
    missing (a hard link for a file, a check and a rename for a folder)."""
    if request.param == "fallback":
        monkeypatch.setattr(_seal, "_renameat2_fn", lambda: None)
    else:
        assert _seal._renameat2_fn() is not None, "no renameat2 through ctypes here"
    return request.param


def test_a_file_takes_a_free_name(tmp_path, how):
    (tmp_path / "a.part").write_text("new")
    assert _seal.seal(str(tmp_path / "a.part"), str(tmp_path / "a"))
    assert (tmp_path / "a").read_text() == "new" and not (tmp_path / "a.part").exists()


def test_an_existing_file_is_not_replaced(tmp_path, how):
    (tmp_path / "a").write_text("old")
    (tmp_path / "a.part").write_text("new")
    assert not _seal.seal(str(tmp_path / "a.part"), str(tmp_path / "a"))
    assert (tmp_path / "a").read_text() == "old"
    assert (tmp_path / "a.part").read_text() == "new"  # left to the caller


def test_a_link_in_the_way_is_not_replaced(tmp_path, how):
    (tmp_path / "target").write_text("theirs")
    os.symlink(tmp_path / "target", tmp_path / "a")
    (tmp_path / "a.part").write_text("new")
    assert not _seal.rename_no_replace(str(tmp_path / "a.part"), str(tmp_path / "a"))
    assert os.path.islink(tmp_path / "a") and (tmp_path / "target").read_text() == "theirs"


def test_a_folder_takes_a_free_name_with_its_files(tmp_path, how):
    (tmp_path / "tmp" / "sub").mkdir(parents=True)
    (tmp_path / "tmp" / "sub" / "f").write_text("x")
    assert _seal.seal(str(tmp_path / "tmp"), str(tmp_path / "final"))
    assert (tmp_path / "final" / "sub" / "f").read_text() == "x" and not (tmp_path / "tmp").exists()


def test_an_existing_empty_folder_is_not_replaced(tmp_path, how):
    """``os.rename`` replaces an empty folder in one step: this one stays as it was."""
    (tmp_path / "final").mkdir()
    os.chmod(tmp_path / "final", 0o750)  # to tell it from a new one
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "f").write_text("x")
    assert not _seal.seal(str(tmp_path / "tmp"), str(tmp_path / "final"))
    assert os.listdir(tmp_path / "final") == [] and (os.stat(tmp_path / "final").st_mode & 0o777) == 0o750
    assert (tmp_path / "tmp" / "f").read_text() == "x"


def end_a_python_window(tmp_path, ended):
    """Runs a cProfile window and ends it: stats written in <tmp_path>/.tmp/window, then
    sealed as ``ended``; returns that temporary folder."""
    tmp = tmp_path / ".tmp" / "window"
    windows = _python_profiling.Windows(_lib.NullLibrary())
    run = _python_profiling._CProfileRun(_python_profiling.total_time)
    run.start()
    windows._running = run
    windows._end(str(ended), str(tmp))
    return tmp


def test_a_python_window_never_replaces_a_folder_already_there(tmp_path):
    """The window's stats are dropped (with one log line) rather than put in place of a
    folder of that name; the temporary folder is removed."""
    ended = tmp_path / "framework" / "pytorch" / "cProfile" / "window"
    ended.mkdir(parents=True)
    tmp = end_a_python_window(tmp_path, ended)
    assert os.listdir(ended) == []
    assert not tmp.exists()


def test_a_python_window_is_sealed_with_its_stats(tmp_path):
    ended = tmp_path / "framework" / "pytorch" / "cProfile" / "window"
    end_a_python_window(tmp_path, ended)
    assert os.listdir(ended) == [_python_profiling.CPROFILE_STATS_FILENAME]
    assert not (tmp_path / ".tmp").exists()  # the emptied temporary parents are gone


def test_keras_publish_keeps_a_file_already_there(tmp_path):
    final = tmp_path / "final"
    final.mkdir()
    (final / "n_1_2.metadata").write_text("old")
    staging = tmp_path / "staging"
    (staging / "plugins").mkdir(parents=True)
    (staging / "n_1_2.metadata").write_text("new")
    (staging / "plugins" / "h.trace.json.gz").write_text("trace")
    keras._publish(str(staging), str(final))
    assert (final / "n_1_2.metadata").read_text() == "old"
    assert (final / "plugins" / "h.trace.json.gz").read_text() == "trace"
    assert not staging.exists()
