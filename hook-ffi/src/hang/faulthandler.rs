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

/// `python_stacks.txt` through faulthandler (see [`super`]'s docs); when the Python package
/// registered nothing or faulthandler's handler is no longer the one installed, straight from
/// the interpreter ([`interpreter_stacks`]); `None` when neither can be had.
pub(super) fn python_stacks(h: &Hang) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; MAX_PYTHON_BYTES];
    let Some(n) = python_stacks_into(h, &mut buf) else { return interpreter_stacks() };
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
    Some(read_from_start(fd, buf))
}

/// Reads `fd` from offset 0 into `buf` until its end or `buf` is full; the length read.
/// Async-signal-safe (`pread` only).
fn read_from_start(fd: i32, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: a valid buffer of the given length.
        let n = unsafe { libc::pread(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got, got as i64) };
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    got
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

/// Every Python thread's stack straight from the interpreter, the way faulthandler's own
/// `dump_traceback_later` thread takes them: CPython's traceback dumper
/// (`PyUnstable_DumpTracebackThreads`, or `_Py_DumpTracebackThreads` before it had a public
/// name) called from this thread, which holds no Python thread state and no lock of
/// Python's, writing into an anonymous memfd of ours. No signal, no handler, no Python code:
/// what `trainprof trigger --stacks` uses in a process without `HangDetectionConfig`
/// (docs/formats.md, "On-demand windows (`trainprof trigger`)"). Like faulthandler's thread
/// it reads the frames while the trainer's threads run: the stacks are a snapshot, best
/// effort. `None` when the process has no Python, one not initialised or finalising, or
/// one that exports no dumper.
pub(super) fn interpreter_stacks() -> Option<Vec<u8>> {
    type Flag = unsafe extern "C" fn() -> libc::c_int;
    type Main = unsafe extern "C" fn() -> *mut libc::c_void;
    type Dumper =
        unsafe extern "C" fn(libc::c_int, *mut libc::c_void, *mut libc::c_void) -> *const libc::c_char;
    /// The process's own symbol `name` (NUL-terminated), if any object loaded exports it.
    fn symbol(name: &[u8]) -> Option<*mut libc::c_void> {
        // SAFETY: a NUL-terminated name; RTLD_DEFAULT searches the loaded objects.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr().cast()) };
        (!p.is_null()).then_some(p)
    }
    let initialised = symbol(b"Py_IsInitialized\0")?;
    let finalising = symbol(b"Py_IsFinalizing\0").or_else(|| symbol(b"_Py_IsFinalizing\0"))?;
    let dumper =
        symbol(b"PyUnstable_DumpTracebackThreads\0").or_else(|| symbol(b"_Py_DumpTracebackThreads\0"))?;
    // SAFETY: the symbols have these C signatures in every CPython that exports them
    // (3.8 onwards); a function pointer and a data pointer have one size here.
    let (initialised, finalising, dumper) = unsafe {
        (
            std::mem::transmute::<*mut libc::c_void, Flag>(initialised),
            std::mem::transmute::<*mut libc::c_void, Flag>(finalising),
            std::mem::transmute::<*mut libc::c_void, Dumper>(dumper),
        )
    };
    // SAFETY: both only read the runtime's state.
    if unsafe { initialised() } == 0 || unsafe { finalising() } != 0 {
        return None;
    }
    // The main interpreter, or NULL: the dumper then finds it itself, as faulthandler's.
    let interp = symbol(b"PyInterpreterState_Main\0").map_or(std::ptr::null_mut(), |f| {
        // SAFETY: `PyInterpreterState *PyInterpreterState_Main(void)`, a read of the runtime.
        unsafe { std::mem::transmute::<*mut libc::c_void, Main>(f)() }
    });
    // SAFETY: a NUL-terminated name and a flag.
    let fd = unsafe { libc::memfd_create(c"trainprof-stacks-on-request".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: our own fd; NULL for the current thread state: this thread has none.
    let err = unsafe { dumper(fd, interp, std::ptr::null_mut()) };
    let mut buf = vec![0u8; MAX_PYTHON_BYTES];
    let got = read_from_start(fd, &mut buf);
    // SAFETY: our own fd, closed once.
    unsafe { libc::close(fd) };
    buf.truncate(got);
    if !err.is_null() {
        // SAFETY: the dumper returns a static NUL-terminated message on failure.
        let why = unsafe { std::ffi::CStr::from_ptr(err) }.to_string_lossy();
        buf.extend_from_slice(format!("(the interpreter's dumper: {why})\n").as_bytes());
    }
    Some(buf)
}
