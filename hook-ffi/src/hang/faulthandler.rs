//! Python stacks through faulthandler (see [`super`]'s docs, "Python stacks"): the package's
//! `faulthandler.register` on a free real-time signal writes every Python thread's stack to an
//! anonymous memfd when that signal is sent to the calling thread; no Python code runs.
//! Async-signal-safe ([`python_stacks_into`]): the crash handler uses it too.

use std::sync::atomic::Ordering::SeqCst;

use super::fixed::fmt_into;
use super::{Hang, MAX_PYTHON_BYTES, gettid};
use crate::signals;

/// What `/proc/self/fd/<n>` of the package's memfd starts with (its name,
/// `trainprof-python-stacks`, hook-ffi/python/trainprof/_hang.py).
const PYTHON_MEMFD: &str = "/memfd:trainprof-python-stacks";

/// `python_stacks.txt` through faulthandler (see [`super`]'s docs), or `None` when the Python
/// package registered nothing or faulthandler's handler is no longer the one installed.
pub(super) fn python_stacks(h: &Hang) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; MAX_PYTHON_BYTES];
    let n = python_stacks_into(h, &mut buf)?;
    buf.truncate(n);
    Some(buf)
}

/// Every Python thread's stack into `buf` through the package's faulthandler registration:
/// the memfd emptied, the signal sent to the calling thread (faulthandler's handler has run
/// when that returns), the memfd read back; the length. `None` when the package registered
/// nothing, the fd is no longer its memfd (closed and reused for a file of the trainer's,
/// which the truncation would destroy), or faulthandler's handler is no longer the one
/// installed (Python's finalisation removes it, the default action of a real-time signal
/// would end the process, and a handler the trainer installed since must never be called by
/// a dump). Async-signal-safe (raw calls, no allocation): the crash handler uses it too.
pub(super) fn python_stacks_into(h: &Hang, buf: &mut [u8]) -> Option<usize> {
    let fd = h.python_fd.load(SeqCst);
    let sig = h.python_signal.load(SeqCst);
    if fd < 0 || sig <= 0 || signals::handler(sig) != h.python_handler.load(SeqCst) {
        return None;
    }
    let mut path = [0u8; 48];
    if fmt_into(&mut path, format_args!("/proc/self/fd/{fd}")) >= path.len() {
        return None;
    }
    let mut link = [0u8; 64];
    // SAFETY: a NUL-terminated path and a valid buffer.
    let n = unsafe { libc::readlink(path.as_ptr().cast(), link.as_mut_ptr().cast(), link.len()) };
    if n <= 0 || !link[..n as usize].starts_with(PYTHON_MEMFD.as_bytes()) {
        return None;
    }
    // SAFETY: plain system calls on the registered fd.
    unsafe {
        libc::ftruncate(fd, 0);
        libc::lseek(fd, 0, libc::SEEK_SET);
    }
    raise_here(sig);
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: a valid buffer of the given length.
        let n = unsafe { libc::pread(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got, got as i64) };
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    Some(got)
}

/// Sends `sig` to the calling thread with `sig` unblocked for the call (trainprof's threads
/// block every asynchronous signal, [`signals::spawn_thread`]): its handler has run when this
/// returns.
fn raise_here(sig: i32) {
    let old = signals::thread_mask(libc::SIG_UNBLOCK, signals::bit(sig));
    // SAFETY: tgkill with this process's pid, the calling thread and a signal number.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), gettid(), sig) };
    signals::thread_mask(libc::SIG_SETMASK, old);
}
