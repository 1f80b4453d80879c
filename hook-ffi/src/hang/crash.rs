//! The crash dump (see [`super`]'s docs, "Fatal signals"), written by the crash handler
//! ([`super::chain`]) on the crashing thread: async-signal-safe throughout. Raw system calls
//! (`mkdirat`/`openat` under the node's folder, opened when armed), formatting into static
//! buffers ([`Fixed`], `CRASH_BUF`, `CRASH_RING`): no allocation, no lock.

use std::fmt::Write as _;
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::*};

use trainprof_output::fs::Dir;
use trainprof_output::protocol::dump::{
    HOOK_CRASH, HOOK_DUMPS, HOOK_ENABLED, NATIVE_STACKS_FILE, PYTHON_STACKS_FILE, STALL_FILE,
};

use super::faulthandler::python_stacks_into;
use super::fixed::{Fixed, fmt_into};
use super::record::{DumpKind, Header, signal_name, write_stall_json};
use super::ring::Entry;
use super::{Host, MAX_FRAMES, MAX_PYTHON_BYTES, RING, gettid, in_owner};

/// The node's dump folder (`framework/hangs/<node>`), opened when armed; -1 until then.
pub(super) static FATAL_PARENT_FD: AtomicI32 = AtomicI32::new(-1);

static FATAL_ONCE: AtomicBool = AtomicBool::new(false);

/// The hook, for the crash handler (set when armed).
pub(super) static FATAL_HOOK: std::sync::OnceLock<Arc<dyn Host>> = std::sync::OnceLock::new();

/// A copy of `dir`'s fd that is never closed (the crash handler uses it).
pub(super) fn dup_forever(dir: &Dir) -> std::io::Result<i32> {
    use std::os::fd::AsFd as _;
    // SAFETY: duplicating an open fd.
    let fd = unsafe { libc::fcntl(dir.as_fd().as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 { Err(std::io::Error::last_os_error()) } else { Ok(fd) }
}

/// The crash dump's buffers: static, so that the handler allocates nothing.
struct CrashBuf(std::cell::UnsafeCell<[u8; MAX_PYTHON_BYTES]>);
// SAFETY: used only by the crash handler, once per process (FATAL_ONCE).
unsafe impl Sync for CrashBuf {}
static CRASH_BUF: CrashBuf = CrashBuf(std::cell::UnsafeCell::new([0; MAX_PYTHON_BYTES]));

struct CrashRing(std::cell::UnsafeCell<[Entry; RING]>);
// SAFETY: as CrashBuf.
unsafe impl Sync for CrashRing {}
static CRASH_RING: CrashRing = CrashRing(std::cell::UnsafeCell::new([Entry::EMPTY; RING]));

/// Writes `bytes` as the new file `name` (one of [`trainprof_output::protocol::dump::FILES`]) in the folder `dir` (raw
/// calls; no follow, no replace). The name is made NUL-terminated in a stack buffer: no
/// allocation.
fn raw_write_new(dir: i32, name: &str, bytes: &[u8]) {
    let mut cname = [0u8; 64];
    if name.len() >= cname.len() || name.as_bytes().contains(&0) {
        return;
    }
    cname[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: an open directory fd, a NUL-terminated name (the zeroed buffer's tail), a valid
    // buffer.
    unsafe {
        let fd = libc::openat(
            dir,
            cname.as_ptr().cast(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644,
        );
        if fd < 0 {
            return;
        }
        let mut off = 0;
        while off < bytes.len() {
            let n = libc::write(fd, bytes[off..].as_ptr().cast(), bytes.len() - off);
            if n <= 0 {
                break;
            }
            off += n as usize;
        }
        libc::close(fd);
    }
}

/// The crash's dump, once per process and only in the process that armed it.
pub(super) fn crash_dump(sig: i32) {
    if in_owner() && !FATAL_ONCE.swap(true, SeqCst) {
        write_crash(sig);
    }
}

fn write_crash(sig: i32) {
    let parent = FATAL_PARENT_FD.load(SeqCst);
    let Some(hook) = FATAL_HOOK.get() else { return };
    let Some(hang) = hook.hang() else { return };
    if parent < 0 {
        return;
    }
    let state = hook.step_state();
    let detected_us = crate::now_us();
    // The folder: made here (mkdirat does not follow a link in the last component, and
    // fails on any existing name), then opened without following one.
    let mut name = [0u8; 64];
    if fmt_into(&mut name, format_args!("{}-{detected_us}", state.step.max(0))) >= name.len() {
        return;
    }
    // SAFETY: an open directory fd and a NUL-terminated name.
    let dir = unsafe {
        if libc::mkdirat(parent, name.as_ptr().cast(), 0o755) != 0 {
            return;
        }
        libc::openat(
            parent,
            name.as_ptr().cast(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
        return;
    }
    // SAFETY: once per process (FATAL_ONCE); nothing else touches these buffers.
    let (buf, ring) = unsafe { (&mut *CRASH_BUF.0.get(), &mut *CRASH_RING.0.get()) };
    // Every Python thread's stack, faulthandler's (through the package's registration).
    let got = python_stacks_into(hang, buf).unwrap_or(0);
    if got > 0 {
        raw_write_new(dir, PYTHON_STACKS_FILE, &buf[..got]);
    }
    // The crashing thread's native stack.
    let mut ips = [0usize; MAX_FRAMES];
    let mut n = 0;
    // SAFETY: unwinding this thread's own stack into a local array.
    unsafe {
        backtrace::trace_unsynchronized(|f| {
            if n >= MAX_FRAMES {
                return false;
            }
            ips[n] = f.ip() as usize;
            n += 1;
            true
        });
    }
    let len = {
        let mut f = Fixed { buf: &mut buf[..], len: 0 };
        let _ = writeln!(f, "thread {} (crashed: {})", gettid(), signal_name(sig));
        for (k, ip) in ips[..n].iter().filter(|ip| **ip != 0).enumerate() {
            let _ = write!(f, "  #{k} 0x{ip:x} ");
            let _ = dladdr_name(&mut f, *ip);
            let _ = f.write_str("\n");
        }
        f.len
    };
    raw_write_new(dir, NATIVE_STACKS_FILE, &buf[..len]);
    let count = hang.ring.snapshot(ring);
    let header = Header {
        kind: DumpKind::Fatal,
        node: hook.node_id(),
        pid: hook.os_pid(),
        state,
        detected_us,
        threshold_s: None,
        median_step_s: None,
        signal: Some(sig),
    };
    let dumps = hang.dumps.fetch_add(1, SeqCst) + 1;
    let stats = |out: &mut dyn std::fmt::Write| {
        write!(
            out,
            "{{\"{HOOK_ENABLED}\": {}, \"{HOOK_DUMPS}\": {dumps}, \"{HOOK_CRASH}\": true}}",
            hook.is_enabled()
        )
    };
    let len = {
        let mut f = Fixed { buf: &mut buf[..], len: 0 };
        match write_stall_json(&mut f, &header, &ring[..count], &[], &[], &stats) {
            Ok(()) => f.len,
            Err(_) => 0,
        }
    };
    if len > 0 {
        // Last: its presence says the folder is complete.
        raw_write_new(dir, STALL_FILE, &buf[..len]);
    }
    // SAFETY: the fd opened above.
    unsafe { libc::close(dir) };
}

/// The symbol `dladdr` finds for `ip` (the exported name, mangled), or `??`.
fn dladdr_name(f: &mut Fixed<'_>, ip: usize) -> std::fmt::Result {
    // SAFETY: all-zero is a valid Dl_info.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer; the address is only looked up.
    if unsafe { libc::dladdr(ip.saturating_sub(1) as *const libc::c_void, &mut info) } != 0
        && !info.dli_sname.is_null()
    {
        // SAFETY: dladdr returns a NUL-terminated name that lives as long as the library.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dli_sname) };
        match name.to_str() {
            Ok(_) => write!(f, "{}", backtrace::SymbolName::new(name.to_bytes())),
            Err(_) => f.write_str("??"),
        }
    } else {
        f.write_str("??")
    }
}
