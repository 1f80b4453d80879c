//! One line of a system metrics file (`docs/formats.md`, "System files: line format"),
//! both halves: the agent's writer ([`push_head`], [`push_value`], [`push_tail`]) and the
//! report's reader ([`for_each_line`], [`parse`]), side by side so that neither changes
//! alone (the round trip is tested below).
//!
//! ```text
//! {"Type":"cpu","Name":"cpu0","Dimension":"CPUUtilization","Value":12.5,"NodeId":"algo-1","Timestamp":1795316901.523417}
//! ```
//!
//! Writing is by hand rather than through `serde_json` or `write!`: formatting was the
//! largest part of the agent's own CPU per tick after parsing (BENCHMARKS.md, "the agent
//! against its floor"), so a tick's lines are built from pieces ([`push_head`] once per
//! key, reused while the keys stay the same), and numbers without the float formatter.
//! Reading a file the trainer's user may have written is bounded: a line longer than
//! [`MAX_LINE`] is skipped without being held.

use std::fmt::Write as _;
use std::io::{self, BufRead, Read as _};

use serde::Deserialize;

pub use super::decimal::push_u64;
use super::metric::{MetricType, Name};

/// The key of the tick's time (epoch seconds), which the agent's repair reads alone.
pub const TIMESTAMP_KEY: &str = "Timestamp";

/// A line longer than this is skipped by the reader (ours are < 200 bytes).
pub const MAX_LINE: u64 = 64 * 1024;

/// `{"Type":…,"Name":…,"Dimension":…,"Value":`, the part of a line before its value.
/// Strings are written without escaping: every Type, Name and Dimension is ASCII from the
/// vocabulary ([`super::metric`]; a process's label is sanitised).
#[inline]
pub fn push_head(buf: &mut String, kind: MetricType, name: &Name, dimension: &str) {
    buf.push_str(r#"{"Type":""#);
    buf.push_str(kind.as_str());
    buf.push_str(r#"","Name":""#);
    name.push_to(buf);
    buf.push_str(r#"","Dimension":""#);
    buf.push_str(dimension);
    buf.push_str(r#"","Value":"#);
}

/// `,"NodeId":…,"Timestamp":…}` and the newline: the end of a line, the same for every line
/// of a tick. `us`: the tick's time in whole microseconds (`(wall_s × 10⁶).round()`).
pub fn push_tail(buf: &mut String, node_id: &str, us: f64) {
    buf.push_str(r#","NodeId":""#);
    buf.push_str(node_id);
    buf.push_str(r#"","Timestamp":"#);
    push_timestamp(buf, us);
    buf.push_str("}\n");
}

/// Below this many hundredths a value rounded to two decimals is written digit by digit:
/// there the gap between two doubles (at most 2⁻⁹ below 10¹³) is far below 0.01, so the
/// double nearest `n / 100` has exactly one shortest round-trip decimal, `n / 100` itself
/// with its trailing zeros dropped, which is what `{}` prints for it.
const EXACT_HUNDREDTHS: f64 = 1e15;

/// Appends `(value × 100).round() / 100` as `{}` prints it (the shortest decimal that reads
/// back as the same double, never an exponent, `-0` for negative zero). Hand-written
/// rather than through the float formatter, which costs several times more per value
/// (measured in BENCHMARKS.md); values outside [`EXACT_HUNDREDTHS`] and those that are
/// not finite take the formatter. The tests compare both on millions of values. `value`
/// must be finite (JSON has no NaN; the agent leaves such values out).
#[inline]
pub fn push_value(buf: &mut String, value: f64) {
    let hundredths = (value * 100.0).round();
    if !hundredths.is_finite() {
        // `value × 100` overflowed (above 1.8e306): a double that large has no hundredths,
        // and `inf` is not JSON.
        let _ = write!(buf, "{value}");
        return;
    }
    if hundredths.abs() >= EXACT_HUNDREDTHS {
        let _ = write!(buf, "{}", hundredths / 100.0);
        return;
    }
    if hundredths.is_sign_negative() {
        buf.push('-');
    }
    // Exact: an integral double below 10¹⁵.
    let n = hundredths.abs() as u64;
    push_u64(buf, n / 100);
    let frac = n % 100;
    if frac != 0 {
        buf.push('.');
        buf.push(char::from(b'0' + (frac / 10) as u8));
        if !frac.is_multiple_of(10) {
            buf.push(char::from(b'0' + (frac % 10) as u8));
        }
    }
}

/// Below this many microseconds (2³² s, the year 2106) two doubles are less than 1 µs
/// apart (at most 2⁻²¹ s), so the double nearest `us / 10⁶` has exactly one shortest
/// round-trip decimal with at most six decimals, `us / 10⁶` itself with its trailing zeros
/// dropped, which is what `{}` prints for it.
const EXACT_MICROS: f64 = 4_294_967_296e6;

/// Appends `us / 10⁶` (`us` a whole number of microseconds, as [`round_us`] rounds) as `{}`
/// prints that double, by hand for the reason of [`push_value`]; out of
/// [`EXACT_MICROS`] (or negative) through the formatter. The tests compare both.
fn push_timestamp(buf: &mut String, us: f64) {
    if us.is_sign_negative() || !(0.0..EXACT_MICROS).contains(&us) {
        let _ = write!(buf, "{}", us / 1e6);
        return;
    }
    // Exact: an integral double below 2⁵³.
    let us = us as u64;
    push_u64(buf, us / 1_000_000);
    let mut frac = us % 1_000_000;
    if frac != 0 {
        let mut width = 6;
        while frac.is_multiple_of(10) {
            frac /= 10;
            width -= 1;
        }
        buf.push('.');
        let mut digits = [b'0'; 6];
        for slot in digits[..width].iter_mut().rev() {
            *slot = b'0' + (frac % 10) as u8;
            frac /= 10;
        }
        // Only ASCII digits were written.
        buf.push_str(std::str::from_utf8(&digits[..width]).unwrap_or_default());
    }
}

/// `wall_s` to the microsecond: all the readers keep (they compare in ns from a float).
pub fn round_us(wall_s: f64) -> f64 {
    (wall_s * 1e6).round() / 1e6
}

/// One line as read back.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SysLine {
    #[serde(rename = "Type")]
    pub ty: String,
    /// Optional for smdebug's parser; empty when absent.
    #[serde(rename = "Name", default)]
    pub name: String,
    #[serde(rename = "Dimension")]
    pub dimension: String,
    #[serde(rename = "Value")]
    pub value: f64,
    #[serde(rename = "NodeId")]
    pub node: String,
    #[serde(rename = "Timestamp")]
    pub timestamp: f64,
}

/// One line (at most [`MAX_LINE`] bytes, as [`for_each_line`] hands them on), or `None`
/// when it is not a system metrics line.
pub fn parse(line: &[u8]) -> Option<SysLine> {
    serde_json::from_slice(line).ok()
}

/// Calls `f(line)` for every line of `r` up to [`MAX_LINE`] bytes (longer ones are skipped
/// whole, never held in memory); `Ok(skipped)`.
pub fn for_each_line(mut r: impl BufRead, mut f: impl FnMut(&[u8])) -> io::Result<u64> {
    let mut buf = Vec::new();
    let mut skipped = 0;
    loop {
        buf.clear();
        let n = (&mut r).take(MAX_LINE + 1).read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Ok(skipped);
        }
        if buf.last() != Some(&b'\n') && buf.len() as u64 > MAX_LINE {
            r.skip_until(b'\n')?;
            skipped += 1;
            continue;
        }
        f(&buf);
    }
}

#[cfg(test)]
mod tests {
    use super::super::metric::{Label, dimension, name};
    use super::*;

    /// One whole line.
    fn line(kind: MetricType, name: &Name, dimension: &str, value: f64, node: &str, wall_s: f64) -> String {
        let mut buf = String::new();
        push_head(&mut buf, kind, name, dimension);
        push_value(&mut buf, value);
        push_tail(&mut buf, node, (wall_s * 1e6).round());
        buf
    }

    /// The line as the formatter writes it: the reference the hand-written one must equal
    /// byte for byte.
    fn reference_line(
        kind: MetricType,
        name: &Name,
        dimension: &str,
        value: f64,
        node: &str,
        ts: f64,
    ) -> String {
        let v = rounded(value);
        format!(
            "{{\"Type\":\"{kind}\",\"Name\":\"{name}\",\"Dimension\":\"{dimension}\",\"Value\":{v},\"NodeId\":\"{node}\",\"Timestamp\":{ts}}}\n"
        )
    }

    /// `value` to two decimals, as a reader gets it back.
    fn rounded(value: f64) -> f64 {
        let v = (value * 100.0).round() / 100.0;
        if v.is_finite() { v } else { value }
    }

    /// The next number of a xorshift64* sequence: deterministic, no crate needed.
    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x >> 12;
        *x ^= *x << 25;
        *x ^= *x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Values a tick can hold: percentages, rates, byte counts, negatives (a clock offset),
    /// halves at the rounding edge, huge and tiny magnitudes, and pseudo-random ones
    /// across every magnitude from 10⁻⁶ to 10²⁰.
    fn sample_values() -> Vec<f64> {
        let mut out = vec![
            0.0,
            -0.0,
            0.001,
            -0.001,
            0.004_999,
            0.005,
            -0.005,
            0.015,
            0.045,
            0.125,
            1.005,
            1.015,
            2.675,
            12.345,
            99.999,
            100.0,
            123_456_789.0,
            25_275_990_016.0,
            1e13,
            1e13 - 0.01,
            9_999_999_999_999.99,
            1e14,
            9.007_199_254_740_993e15,
            1e16,
            1e20,
            1e300,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            -123.456,
            -1e14,
        ];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2_000_000 {
            let r = xorshift(&mut x);
            let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
            let exp = (r % 27) as i32 - 6;
            let sign = if r & (1 << 10) == 0 { 1.0 } else { -1.0 };
            let v = sign * unit * 10f64.powi(exp);
            out.push(v);
            // Exactly on a hundredth, and half a hundredth off it.
            let h = (v * 100.0).round() / 100.0;
            out.push(h);
            out.push(h + 0.005);
        }
        out
    }

    fn names() -> [Name; 5] {
        [
            Name::Static(name::MEMORY_USED_PERCENT),
            Name::core(0),
            Name::gpu(4_294_967_295),
            Name::Process(1_234_567, Label::sanitized(b"pt_data_worker")),
            Name::Process(7, Label::sanitized(b"")),
        ]
    }

    const DIMENSIONS: [&str; 4] =
        [dimension::NONE, dimension::CPU_UTILIZATION, dimension::ALGORITHM, dimension::PROCESS_CPU_PERCENT];

    #[test]
    fn lines_are_byte_for_byte_what_the_formatter_wrote() {
        let names = names();
        let ts = 1_595_455_620.123_456;
        for (i, v) in sample_values().into_iter().enumerate() {
            let kind = MetricType::ALL[i % MetricType::ALL.len()];
            let (n, d) = (&names[i % names.len()], DIMENSIONS[i % 4]);
            assert_eq!(
                line(kind, n, d, v, "algo-3", ts),
                reference_line(kind, n, d, v, "algo-3", ts),
                "value {v:e}"
            );
        }
        let mut buf = String::new();
        for n in [0, 1, 9, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX] {
            buf.clear();
            push_u64(&mut buf, n);
            assert_eq!(buf, n.to_string());
        }
    }

    #[test]
    fn timestamps_are_what_the_formatter_writes() {
        let mut buf = String::new();
        let mut check = |wall: f64| {
            buf.clear();
            push_timestamp(&mut buf, (wall * 1e6).round());
            assert_eq!(buf, round_us(wall).to_string(), "wall {wall:?}");
        };
        for wall in [
            0.0,
            1e-6,
            0.5,
            1.0,
            1_595_455_620.0,
            1_595_455_620.1,
            1_595_455_620.000_001,
            1_595_455_620.999_999_7,
            4_294_967_295.999_999,
            4_294_967_296.0,
            4_294_967_296.000_002,
            9e9,
            -1.5,
            -0.000_000_1,
        ] {
            check(wall);
        }
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..3_000_000 {
            let r = xorshift(&mut x);
            // Whole microseconds up to 2³³ s (past the exact range, through the
            // formatter there), and arbitrary doubles rounded on the way.
            let us = (r >> 31) as f64;
            check(us / 1e6);
            check((r >> 30) as f64 / 1e6 + (r & 0xff) as f64 * 1e-9);
        }
    }

    /// The strings exactly; the numbers to the last bit but one (serde_json's parser,
    /// without its slower `float_roundtrip`, may miss the nearest double by one ulp).
    fn same(back: &SysLine, want: &SysLine, line: &str) {
        let close = |a: f64, b: f64| (a - b).abs() <= b.abs() * 2.0 * f64::EPSILON;
        assert_eq!(
            (&back.ty, &back.name, &back.dimension, &back.node),
            (&want.ty, &want.name, &want.dimension, &want.node)
        );
        assert!(close(back.value, want.value), "{line}: {} != {}", back.value, want.value);
        assert!(close(back.timestamp, want.timestamp), "{line}: {} != {}", back.timestamp, want.timestamp);
    }

    #[test]
    fn what_the_writer_writes_the_reader_reads_back() {
        let names = names();
        let mut x: u64 = 0x1234_5678_9ABC_DEF1;
        let mut file = String::new();
        let mut expected = Vec::new();
        // Every magnitude a metric holds (bytes, rates; serde_json refuses integers near
        // f64::MAX written out in full).
        let values = sample_values().into_iter().filter(|v| v.abs() <= 1e20).take(200_000);
        for (i, v) in values.enumerate() {
            let kind = MetricType::ALL[i % MetricType::ALL.len()];
            let (n, d) = (&names[i % names.len()], DIMENSIONS[i % 4]);
            let wall = 1_595_455_620.0 + (xorshift(&mut x) >> 34) as f64 / 1e6;
            let l = line(kind, n, d, v, "algo-12", wall);
            let back = parse(l.as_bytes()).unwrap_or_else(|| panic!("{l}"));
            let want = SysLine {
                ty: kind.to_string(),
                name: n.to_string(),
                dimension: d.to_owned(),
                value: rounded(v),
                node: "algo-12".to_owned(),
                timestamp: round_us(wall),
            };
            same(&back, &want, &l);
            file.push_str(&l);
            expected.push(want);
        }
        // A file of them, through the bounded line reader.
        let mut read = Vec::new();
        let long = for_each_line(file.as_bytes(), |l| read.extend(parse(l))).unwrap();
        assert_eq!(long, 0);
        assert_eq!(read.len(), expected.len());
        for (back, want) in read.iter().zip(&expected) {
            same(back, want, "a line of the file");
        }
    }

    #[test]
    fn the_reader_skips_long_lines_without_holding_them_and_rejects_what_is_not_a_line() {
        let good = line(MetricType::Cpu, &Name::core(1), dimension::CPU_UTILIZATION, 5.0, "algo-1", 1e9);
        let huge = format!("{{\"Type\":\"{}\"}}\n", "x".repeat(MAX_LINE as usize));
        let unterminated = "y".repeat(MAX_LINE as usize + 10);
        let text = [good.as_str(), &huge, &good, &unterminated].concat();
        let mut lines = Vec::new();
        let skipped = for_each_line(text.as_bytes(), |l| lines.push(l.len())).unwrap();
        assert_eq!(skipped, 2);
        assert_eq!(lines, [good.len(), good.len()]);
        // A line of exactly MAX_LINE bytes is still read.
        let edge = "z".repeat(MAX_LINE as usize - 1) + "\n";
        assert_eq!(for_each_line(edge.as_bytes(), |l| assert_eq!(l.len() as u64, MAX_LINE)).unwrap(), 0);
        for bad in [
            "",
            "{}",
            "[1]",
            r#"{"Type":"cpu","Name":"cpu0","Value":1,"NodeId":"a","Timestamp":1}"#,
            r#"{"Type":"cpu","Dimension":"","Value":"1","NodeId":"a","Timestamp":1}"#,
            r#"{"Type":"cpu","Dimension":"","Value":1,"NodeId":"a","Timestamp":1"#,
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad}");
        }
        assert!(good.contains(&format!(",\"{TIMESTAMP_KEY}\":")));
        // Name is optional, as for smdebug's parser.
        let no_name =
            parse(br#"{"Type":"cpu","Dimension":"","Value":1,"NodeId":"a","Timestamp":1}"#).unwrap();
        assert_eq!(no_name.name, "");
    }
}
