//! `trainprof trigger --stacks` in a process without `HangDetectionConfig` (docs/formats.md,
//! "On-demand windows (`trainprof trigger`)"): a short-lived thread of trainprof's writes one
//! dump of kind `requested`, in the flight recorder's folder and format, and ends. It takes
//! nothing for longer than the dump: the Python stacks come straight from the interpreter
//! (no signal, [`super::faulthandler::interpreter_stacks`]); the native stacks borrow a free
//! real-time signal for the dump's duration and give it back
//! ([`super::unwind::release_native_signal`]), so the process's dispositions afterwards are
//! the ones it had. The step and event rings are empty (nothing recorded them).

use std::sync::{Arc, Mutex, PoisonError};

use trainprof_config::HangDetection;

use super::record::{DumpKind, dump};
use super::unwind::release_native_signal;
use super::{Hang, Host};
use crate::signals;

/// Where the thread leaves its result: `Some(Some(folder))` once written, `Some(None)` when
/// it could not be.
pub type Outcome = Arc<Mutex<Option<Option<String>>>>;

/// Starts the thread; its [`Outcome`] is read with [`take`].
pub fn dump_now<H: Host>(hook: Arc<H>) -> std::io::Result<Outcome> {
    let outcome: Outcome = Arc::new(Mutex::new(None));
    let out = Arc::clone(&outcome);
    signals::spawn_thread("trainprof-stacks", move || {
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let hang = Hang::new(HangDetection::not_configured());
            let dir = dump(&*hook, &hang, None, DumpKind::Requested, None, None, None);
            release_native_signal();
            dir
        }));
        let dir = ran.unwrap_or_else(|_| {
            release_native_signal();
            crate::log(&format_args!("stacks on request failed (internal error)"));
            None
        });
        *out.lock().unwrap_or_else(PoisonError::into_inner) = Some(dir);
    })?;
    Ok(outcome)
}

/// The thread's result once it has one.
pub fn take(outcome: &Outcome) -> Option<Option<String>> {
    outcome.lock().unwrap_or_else(PoisonError::into_inner).take()
}
