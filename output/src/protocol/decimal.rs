//! Decimal digits without the formatting machinery, for the writers of system lines and
//! of the Names that are data (`cpu3`, `pid42-python`).

/// Appends `n` in decimal (as `{}` does), without the formatting machinery.
#[inline]
pub fn push_u64(buf: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    buf.push_str(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}
