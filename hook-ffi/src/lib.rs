//! `libtrainprof_hook.so`: the C ABI that a trainer loads (ctypes, or LD_PRELOAD and dlsym).
//!
//! This is the crate's foundation: the version contract that the Python package checks
//! before it calls anything else. The step / phase / window API, the event queue and the
//! timeline writer build on it.
//!
//! Every export is `extern "C"`, never unwinds (a panic is caught and turned into a fixed
//! return value) and does nothing at load time.

use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The ABI version: bumped whenever an export changes meaning or signature. The Python
/// package refuses a library whose ABI version differs from its own.
pub const ABI_VERSION: u32 = 1;

/// The crate version, NUL-terminated for C.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// Runs `f`, returning `fallback` if it panics: no panic may cross the C ABI.
pub(crate) fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// The ABI version ([`ABI_VERSION`]).
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_abi_version() -> u32 {
    guard(0, || ABI_VERSION)
}

/// The library's version as a static NUL-terminated string (`"0.1.0"`); never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_version() -> *const c_char {
    guard(c"?".as_ptr(), || VERSION.as_ptr().cast())
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;

    #[test]
    fn versions() {
        assert_eq!(trainprof_abi_version(), ABI_VERSION);
        // SAFETY: trainprof_version returns a pointer to a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(trainprof_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn guard_catches_panics() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        assert_eq!(guard(-1, || -> i32 { panic!("inside") }), -1);
        std::panic::set_hook(prev);
    }
}
