//! The kernel's clock synchronisation state, once a minute (`docs/formats.md`, "Clock
//! error bound"): whether NTP (or PTP, chrony, …) keeps the clock synchronised, and the
//! kernel's maximum and estimated error, so that a comparison of two nodes' timelines knows
//! how far it can trust their time axes.
//!
//! Read with `adjtimex` with `modes = 0`, which changes nothing and needs no privilege.
//! Type `clock`, Dimension `Kernel`, Names `Synchronised` (1 or 0), `MaxErrorMicros`,
//! `EstimatedErrorMicros`.

use std::io;
use std::time::Duration;

use super::{Metrics, Name, SampleError, Sampler};
use super::{dimension as d, name as n};

/// How often the state is read (and on the first tick).
pub const EVERY: Duration = Duration::from_secs(60);

/// What `adjtimex` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NtpState {
    pub synchronised: bool,
    /// The kernel's bound on the clock's error, µs (16 s when nothing disciplines it).
    pub max_error_us: u64,
    /// The kernel's estimate of the clock's error, µs.
    pub est_error_us: u64,
}

/// `adjtimex`'s return value (the clock state) and fields, as an [`NtpState`]: not
/// synchronised when the state is `TIME_ERROR` or the status has `STA_UNSYNC`.
pub fn ntp_state(state: libc::c_int, status: libc::c_int, maxerror: i64, esterror: i64) -> NtpState {
    NtpState {
        synchronised: state != libc::TIME_ERROR && status & libc::STA_UNSYNC == 0,
        max_error_us: u64::try_from(maxerror).unwrap_or(0),
        est_error_us: u64::try_from(esterror).unwrap_or(0),
    }
}

/// Reads the kernel's state without changing it.
pub fn read_ntp_state() -> io::Result<NtpState> {
    // SAFETY: an all-zero timex is valid; modes = 0 asks adjtimex to read only, and it
    // writes into the struct we own.
    unsafe {
        let mut tx: libc::timex = std::mem::zeroed();
        tx.modes = 0;
        let state = libc::adjtimex(&mut tx);
        if state < 0 {
            return Err(io::Error::last_os_error());
        }
        #[allow(clippy::useless_conversion)] // c_long is i32 on 32-bit targets.
        Ok(ntp_state(state, tx.status, i64::from(tx.maxerror), i64::from(tx.esterror)))
    }
}

/// The clock sampler; the source is a function so that tests can script it.
pub struct ClockSampler {
    read: fn() -> io::Result<NtpState>,
    next_at: Option<Duration>,
}

impl std::fmt::Debug for ClockSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClockSampler").field("next_at", &self.next_at).finish_non_exhaustive()
    }
}

impl ClockSampler {
    /// The kernel's clock; `Err` when `adjtimex` is refused (a seccomp profile).
    pub fn probe() -> Result<ClockSampler, SampleError> {
        ClockSampler::with(read_ntp_state)
    }

    pub fn with(read: fn() -> io::Result<NtpState>) -> Result<ClockSampler, SampleError> {
        read().map_err(|e| SampleError::Device { device: "adjtimex".into(), what: e.to_string() })?;
        Ok(ClockSampler { read, next_at: None })
    }
}

impl Sampler for ClockSampler {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn sample(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        if self.next_at.is_some_and(|t| now < t) {
            return Ok(());
        }
        self.next_at = Some(now + EVERY);
        let s = (self.read)()
            .map_err(|e| SampleError::Device { device: "adjtimex".into(), what: e.to_string() })?;
        let kind = crate::pipeline::sample::MetricType::Clock;
        out.push(kind, Name::Static(n::SYNCHRONISED), d::KERNEL, if s.synchronised { 1.0 } else { 0.0 });
        out.push(kind, Name::Static(n::MAX_ERROR_MICROS), d::KERNEL, s.max_error_us as f64);
        out.push(kind, Name::Static(n::ESTIMATED_ERROR_MICROS), d::KERNEL, s.est_error_us as f64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_and_the_status_bit() {
        let ok = ntp_state(libc::TIME_OK, 0x2001, 16_500, 12);
        assert_eq!(ok, NtpState { synchronised: true, max_error_us: 16_500, est_error_us: 12 });
        assert!(!ntp_state(libc::TIME_ERROR, 0, 1, 1).synchronised);
        assert!(!ntp_state(libc::TIME_OK, libc::STA_UNSYNC, 1, 1).synchronised);
        assert_eq!(ntp_state(libc::TIME_OK, 0, -1, -5).max_error_us, 0);
    }

    #[test]
    fn the_real_clock_on_the_first_tick_then_once_a_minute() {
        let mut s = ClockSampler::probe().unwrap();
        let mut m = Metrics::new();
        s.sample(Duration::from_secs(3), &mut m).unwrap();
        let synced = m.get("clock", "Synchronised", "Kernel").unwrap();
        assert!(synced == 0.0 || synced == 1.0);
        assert!(m.get("clock", "MaxErrorMicros", "Kernel").is_some());
        assert!(m.get("clock", "EstimatedErrorMicros", "Kernel").is_some());
        m.clear();
        s.sample(Duration::from_secs(62), &mut m).unwrap();
        assert!(m.is_empty());
        s.sample(Duration::from_secs(63), &mut m).unwrap();
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn a_refused_call_is_an_error() {
        fn refused() -> io::Result<NtpState> {
            Err(io::Error::from_raw_os_error(libc::EPERM))
        }
        let e = ClockSampler::with(refused).unwrap_err();
        assert!(e.to_string().starts_with("adjtimex: "), "{e}");
    }
}
