"""Putting what the package wrote into place without replacing anything (docs/on-disk.md,
"Nothing is replaced"): written under a temporary name, synced, then given its final name
with ``renameat2(RENAME_NOREPLACE)``, which fails on an existing name, and the folder
synced. The one place the package renames what it wrote: the Python-profiling windows
(``_python_profiling``) and the Keras adapter's detailed profiles (``keras``).

Python has no ``renameat2`` (``os.rename`` replaces a file, or an empty folder, in one
step), so it is called through ctypes: glibc's wrapper (2.28 and later), else the system
call. Where neither is there, or the file system refuses the flag, a file is hard-linked
(a link never replaces) and its temporary name removed, and a folder is renamed after a
check: the same fallbacks as ``output/src/fs.rs``'s ``rename_no_replace``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import threading
from typing import Callable, Optional

__all__ = ["rename_no_replace", "seal"]

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
# renameat2's system call number where glibc has no wrapper (before 2.28).
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}

_Renameat2 = Callable[[bytes, bytes], int]
_renameat2: Optional[_Renameat2] = None
_looked_up = False
_lock = threading.Lock()


def _find_renameat2() -> Optional[_Renameat2]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int

        def wrapper(src: bytes, dst: bytes) -> int:
            r: int = fn(_AT_FDCWD, src, _AT_FDCWD, dst, _RENAME_NOREPLACE)
            return r

        return wrapper
    nr = _SYS_RENAMEAT2.get(platform.machine())
    syscall = getattr(libc, "syscall", None)
    if nr is None or syscall is None:
        return None
    syscall.restype = ctypes.c_long

    def via_syscall(src: bytes, dst: bytes) -> int:
        r: int = syscall(
            ctypes.c_long(nr),
            ctypes.c_int(_AT_FDCWD),
            src,
            ctypes.c_int(_AT_FDCWD),
            dst,
            ctypes.c_uint(_RENAME_NOREPLACE),
        )
        return r

    return via_syscall


def _renameat2_fn() -> Optional[_Renameat2]:
    global _renameat2, _looked_up
    with _lock:
        if not _looked_up:
            _renameat2 = _find_renameat2()
            _looked_up = True
        return _renameat2


def rename_no_replace(src: str, dst: str) -> bool:
    """Gives ``src`` (a file or a folder) the name ``dst`` unless that name exists (a file,
    a folder, empty or not, a link): then False, and nothing moved. Other failures raise
    ``OSError``."""
    fn = _renameat2_fn()
    if fn is not None:
        if fn(os.fsencode(src), os.fsencode(dst)) == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            return False
        if err not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(err, os.strerror(err), src, None, dst)
    if not os.path.isdir(src) or os.path.islink(src):
        try:
            os.link(src, dst, follow_symlinks=False)
        except FileExistsError:
            return False
        os.unlink(src)
        return True
    if os.path.lexists(dst):
        return False
    os.rename(src, dst)
    return True


def _fsync(path: str, flags: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(path: str) -> None:
    """Syncs the file ``path``, or every file and folder in the folder ``path``."""
    if not os.path.isdir(path) or os.path.islink(path):
        _fsync(path, 0)
        return
    for folder, _, files in os.walk(path):
        for f in files:
            p = os.path.join(folder, f)
            if os.path.isfile(p) and not os.path.islink(p):
                _fsync(p, 0)
        _fsync(folder, os.O_DIRECTORY)


def seal(tmp: str, final: str) -> bool:
    """Seals ``tmp`` (a complete file, or a folder of complete files, that the package
    wrote) as ``final``: synced, renamed with :func:`rename_no_replace`, the folder of
    ``final`` synced. False when ``final`` exists: then ``tmp`` is left as it is, for the
    caller to remove (it is the caller's own) or to seal under another name."""
    _sync_tree(tmp)
    if not rename_no_replace(tmp, final):
        return False
    try:
        _fsync(os.path.dirname(os.path.abspath(final)), os.O_DIRECTORY)
    except OSError:
        pass  # the name is taken either way; a failed sync does not undo it
    return True
