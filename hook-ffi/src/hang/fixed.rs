//! Formatting without allocating, into a buffer the caller owns: what the crash handler
//! ([`super::crash`]) and the faulthandler path ([`super::faulthandler`]) format with
//! (async-signal-safe: no allocation, no lock).

use std::fmt::Write as _;

/// A fixed buffer that `write!` fills without allocating; output past the end is cut.
pub(super) struct Fixed<'a> {
    pub(super) buf: &'a mut [u8],
    pub(super) len: usize,
}

impl std::fmt::Write for Fixed<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.buf.len().saturating_sub(self.len);
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        if n < s.len() { Err(std::fmt::Error) } else { Ok(()) }
    }
}

/// Formats into `buf` with a NUL after; the length without it (`buf.len()` when cut).
pub(super) fn fmt_into(buf: &mut [u8], args: std::fmt::Arguments<'_>) -> usize {
    let cap = buf.len().saturating_sub(1);
    let mut f = Fixed { buf: &mut buf[..cap], len: 0 };
    if f.write_fmt(args).is_err() {
        return buf.len();
    }
    let n = f.len;
    buf[n] = 0;
    n
}
