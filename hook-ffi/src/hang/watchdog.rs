//! The watchdog thread (`trainprof-watchdog`): wakes once a second (or at once, woken through
//! a pipe by the SIGTERM/SIGINT handler), judges the open step, writes a dump once per stall
//! and `ended.json` when the stalled step ends (see [`super`]'s docs).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::time::Duration;

use trainprof_output::protocol::dump::ENDED_FILE;

use super::chain::{SIGNAL_DONE, SIGNAL_PENDING, WAKE_FD, wrap_term_signals};
use super::record::{DumpKind, dump, ended_json, write_file};
use super::ring::{Entry, What, median_step_s};
use super::{Hang, Host, OWNER_PID, RING};
use crate::signals;

/// A stall dumped, waiting for its step to end.
struct Stalled {
    dir: String,
    begin_us: i64,
    step: i64,
}

/// Starts the watchdog thread and wraps SIGTERM / SIGINT.
pub fn spawn<H: Host>(hook: Arc<H>) -> std::io::Result<()> {
    let mut fds = [0i32; 2];
    // SAFETY: a valid array of two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let read_fd = fds[0];
    // The process's signals never land on this thread (it writes their dump), nor on any
    // thread of ours: they are the trainer's.
    signals::spawn_thread("trainprof-watchdog", move || {
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&*hook, read_fd)));
        WAKE_FD.store(-1, SeqCst);
        WATCHDOG_DONE.store(true, SeqCst);
        if ran.is_err() {
            crate::log(&format_args!("hang detection failed (internal error); it is off"));
        }
    })?;
    OWNER_PID.store(std::process::id() as i32, SeqCst);
    WAKE_FD.store(fds[1], SeqCst);
    wrap_term_signals();
    Ok(())
}

fn run(hook: &dyn Host, read_fd: i32) {
    let Some(hang) = hook.hang() else { return };
    let mut stalled: Option<Stalled> = None;
    // The begin time of the last step dumped: one dump per stall.
    let mut dumped_begin = i64::MIN;
    let mut entries = Box::new([Entry::EMPTY; RING]);
    loop {
        let mut pfd = libc::pollfd { fd: read_fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 1000) };
        let mut sink = [0u8; 64];
        // SAFETY: a valid buffer; the pipe is non-blocking.
        while unsafe { libc::read(read_fd, sink.as_mut_ptr().cast(), sink.len()) } > 0 {}
        let stopping = hang.stop.load(SeqCst);
        if !stopping {
            wrap_term_signals();
        }
        let sig = SIGNAL_PENDING.swap(0, SeqCst);
        let state = hook.step_state();
        if sig != 0 {
            let _ = dump(hook, hang, Some(state), DumpKind::Signal, Some(sig), None, None);
            SIGNAL_DONE.fetch_add(1, SeqCst);
            // The step the signal came in is dumped: not again as a stall (the process
            // is ending, or its own handler decides).
            if state.in_step {
                dumped_begin = state.begin_us;
            }
        }
        if hang.requested.swap(false, SeqCst) {
            let dir = dump(hook, hang, Some(state), DumpKind::Requested, None, None, None);
            *hang.requested_done.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(dir);
        }
        let now = crate::now_us();
        if let Some(s) = &stalled
            && (!state.in_step || state.begin_us != s.begin_us)
        {
            let n = hang.ring.snapshot(&mut entries);
            let ended_us = entries[..n]
                .iter()
                .find(|e| e.what == What::StepEnd && e.step == s.step && e.t_us >= s.begin_us)
                .map_or(now, |e| e.t_us);
            let body = ended_json(ended_us, s.begin_us);
            if let Err(e) = write_file(hook, &s.dir, ENDED_FILE, body.as_bytes()) {
                crate::log(&format_args!("hang detection: cannot write {}/{ENDED_FILE}: {e}", s.dir));
            } else {
                crate::log(&format_args!(
                    "hang detection: step {} ended after {:.1} s",
                    s.step,
                    (ended_us - s.begin_us) as f64 / 1e6
                ));
            }
            stalled = None;
        }
        if stopping {
            return;
        }
        if state.in_step && stalled.is_none() && dumped_begin != state.begin_us {
            let n = hang.ring.snapshot(&mut entries);
            let median = state.mode.and_then(|m| median_step_s(&entries[..n], m));
            let threshold = hang.config.threshold_s(median);
            let open_s = (now - state.begin_us) as f64 / 1e6;
            if open_s > threshold {
                dumped_begin = state.begin_us;
                crate::log(&format_args!(
                    "hang detection: step {} has not ended after {open_s:.1} s (threshold {threshold:.1} s): writing its dump",
                    state.step
                ));
                if let Some(dir) =
                    dump(hook, hang, Some(state), DumpKind::Stall, None, Some((threshold, median)), None)
                {
                    stalled = Some(Stalled { dir, begin_us: state.begin_us, step: state.step });
                }
            }
        }
    }
}

/// The watchdog thread has returned.
static WATCHDOG_DONE: AtomicBool = AtomicBool::new(false);

/// Stops the watchdog: it writes the `ended.json` of a stall whose step has ended since it
/// last looked, then returns; waits for that at most 2 s.
pub fn stop(hang: &Hang) {
    hang.stop.store(true, SeqCst);
    let wake = WAKE_FD.load(SeqCst);
    if wake < 0 {
        return;
    }
    // SAFETY: write(2) on the pipe, a valid one-byte buffer.
    unsafe { libc::write(wake, b"q".as_ptr().cast(), 1) };
    let t0 = std::time::Instant::now();
    while !WATCHDOG_DONE.load(SeqCst) && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(2));
    }
}
