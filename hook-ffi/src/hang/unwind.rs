//! Native stacks by signal (docs/formats.md, "Hang and crash dumps"): a free real-time
//! signal, sent with `tgkill` to each thread in turn; that thread's handler unwinds itself
//! into a preallocated slot (no allocation, no lock) and the watchdog symbolises on its own
//! thread.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::*};
use std::time::Duration;

use super::{MAX_FRAMES, MAX_THREADS, errno_location, gettid};
use crate::signals::{self, SigInfoHandler};

/// How long the watchdog waits for one thread to unwind itself.
const THREAD_WAIT: Duration = Duration::from_millis(200);

/// The signal of the native-stack handler (0: not installed).
static NATIVE_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The thread asked to unwind itself, its frames and whether it finished.
static SLOT_TID: AtomicI32 = AtomicI32::new(0);
static SLOT_N: AtomicUsize = AtomicUsize::new(0);
/// The thread that finished unwinding into the slot (0: none yet).
static SLOT_DONE: AtomicI32 = AtomicI32::new(0);
static SLOT_IPS: [AtomicUsize; MAX_FRAMES] = [const { AtomicUsize::new(0) }; MAX_FRAMES];

/// The native-stack handler: the thread named in `SLOT_TID` unwinds itself.
extern "C" fn native_handler(_sig: i32, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    let errno = errno_location();
    // SAFETY: the calling thread's errno.
    let saved = unsafe { *errno };
    let me = gettid();
    if SLOT_TID.load(SeqCst) == me && SLOT_DONE.load(SeqCst) == 0 {
        let mut n = 0;
        // SAFETY: the unwinder runs on this thread's own stack; no allocation.
        unsafe {
            backtrace::trace_unsynchronized(|f| {
                if n >= MAX_FRAMES {
                    return false;
                }
                SLOT_IPS[n].store(f.ip() as usize, Relaxed);
                n += 1;
                true
            });
        }
        SLOT_N.store(n, SeqCst);
        SLOT_DONE.store(me, SeqCst);
    }
    // SAFETY: as above.
    unsafe { *errno = saved };
}

/// The native-stack signal while the handler is installed on it, else 0.
pub fn native_signal_now() -> i32 {
    let s = NATIVE_SIGNAL.load(SeqCst);
    if s != 0 && native_installed(s) { s } else { 0 }
}

/// Whether the native-stack handler is still the one installed for `sig` (the trainer may
/// have installed its own since: then the signal is the trainer's).
fn native_installed(sig: i32) -> bool {
    signals::handler(sig) == native_handler as SigInfoHandler as usize
}

/// The signal of the native-stack handler: the one installed before if it is still ours,
/// else the first free real-time signal from the top ([`signals::free_real_time`]; the
/// Python package's is searched from the bottom), installed now; or `None`.
fn native_signal(python_signal: i32) -> Option<i32> {
    let s = NATIVE_SIGNAL.load(SeqCst);
    if s != 0 && native_installed(s) {
        return Some(s);
    }
    let sig = signals::free_real_time(true, &[s, python_signal])?;
    let old = signals::swap(sig, native_handler, libc::SA_RESTART | libc::SA_ONSTACK, 0)?;
    *REPLACED.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(old);
    NATIVE_SIGNAL.store(sig, SeqCst);
    Some(sig)
}

/// The disposition the native-stack handler replaced (a default one), for
/// [`release_native_signal`].
static REPLACED: std::sync::Mutex<Option<libc::sigaction>> = std::sync::Mutex::new(None);

/// Gives the native-stack signal back when the handler installed on it is still ours:
/// first `SIG_IGN`, which discards a signal still pending for a thread that did not answer in
/// time (the default action of a real-time signal would end the process), then the
/// disposition it replaced (a default one: only a signal at `SIG_DFL` is taken,
/// [`signals::free_real_time`]).
/// What a dump in a process without the recorder leaves behind: nothing.
pub fn release_native_signal() {
    let sig = NATIVE_SIGNAL.swap(0, SeqCst);
    let old = REPLACED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    if sig != 0 && native_installed(sig) {
        signals::set_ignore(sig);
        match old {
            Some(old) => signals::restore(sig, &old),
            None => signals::set_default(sig),
        }
    }
}

/// One thread's native stack: its frame addresses, unwound by itself.
fn unwind_thread(pid: i32, tid: i32, sig: i32) -> Result<Vec<usize>, &'static str> {
    if tid == gettid() {
        let mut ips = Vec::new();
        backtrace::trace(|f| {
            ips.push(f.ip() as usize);
            ips.len() < MAX_FRAMES
        });
        return Ok(ips);
    }
    if !native_installed(sig) {
        return Err("the signal is the trainer's now");
    }
    SLOT_DONE.store(0, SeqCst);
    SLOT_N.store(0, SeqCst);
    SLOT_TID.store(tid, SeqCst);
    // SAFETY: tgkill with this process's pid, a thread id and a signal number.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
    if r != 0 {
        SLOT_TID.store(0, SeqCst);
        return Err("gone");
    }
    let t0 = std::time::Instant::now();
    while SLOT_DONE.load(SeqCst) != tid {
        if t0.elapsed() > THREAD_WAIT {
            SLOT_TID.store(0, SeqCst);
            return Err("did not answer in 200 ms");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    SLOT_TID.store(0, SeqCst);
    let n = SLOT_N.load(SeqCst).min(MAX_FRAMES);
    Ok(SLOT_IPS[..n].iter().map(|a| a.load(Relaxed)).collect())
}

/// Drops the frames of the signal handling itself (ours and the unwinder's, up to the
/// kernel's signal trampoline), so that a stack starts where the thread was.
fn strip_handler_frames(frames: &mut Vec<(usize, String)>) {
    if let Some(i) = frames.iter().position(|(_, s)| s.contains("__restore_rt")) {
        frames.drain(..=i);
    } else if let Some(i) = frames.iter().position(|(_, s)| s.contains("hang::unwind::native_handler")) {
        // The trampoline has no symbol of its own: the frame after the handler.
        frames.drain(..(i + 2).min(frames.len()));
    }
}

fn symbol(ip: usize) -> String {
    let mut name = None;
    // The address after a call: look up the call itself.
    backtrace::resolve(ip.saturating_sub(1) as *mut libc::c_void, |s| {
        if name.is_none() {
            name = s.name().map(|n| n.to_string());
        }
    });
    name.unwrap_or_else(|| "??".into())
}

fn thread_name(tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .map(|s| s.trim().chars().filter(|c| !c.is_control()).collect())
        .unwrap_or_else(|_| "?".into())
}

/// `native_stacks.txt`: every thread (at most [`MAX_THREADS`]), each unwinding itself.
/// Trainprof's own threads block the signal ([`signals::spawn_thread`]) and are named only.
pub fn native_stacks(python_signal: i32) -> String {
    let mut out = String::new();
    let Some(sig) = native_signal(python_signal) else {
        return "no free real-time signal for the native stacks\n".into();
    };
    let pid = std::process::id() as i32;
    let mut tids: Vec<i32> = std::fs::read_dir("/proc/self/task")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    tids.sort_unstable();
    for (i, tid) in tids.iter().copied().enumerate() {
        if i == MAX_THREADS {
            let _ = writeln!(out, "({} more threads not shown)", tids.len() - MAX_THREADS);
            break;
        }
        let _ = writeln!(out, "thread {tid} {}", thread_name(tid));
        if signals::is_guest(tid) {
            let _ = writeln!(out, "  (trainprof's own thread: it takes no signal, not unwound)\n");
            continue;
        }
        if tid != gettid() && signals::thread_blocks(tid, sig) {
            // A thread that blocks the signal would leave it pending for its sigwait.
            let _ = writeln!(out, "  (it blocks the signal: not unwound)\n");
            continue;
        }
        match unwind_thread(pid, tid, sig) {
            Ok(ips) => {
                let mut frames: Vec<(usize, String)> =
                    ips.into_iter().filter(|&ip| ip != 0).map(|ip| (ip, symbol(ip))).collect();
                strip_handler_frames(&mut frames);
                for (k, (ip, s)) in frames.iter().enumerate() {
                    let _ = writeln!(out, "  #{k} 0x{ip:x} {s}");
                }
            }
            Err(why) => {
                let _ = writeln!(out, "  ({why})");
            }
        }
        out.push('\n');
    }
    out
}
