//! The common HTML bits of the report's pages (this crate's page, `page/`, and `compare`'s,
//! `compare/page.rs`): escaping (text, attributes, JSON inside a script element), the numbers,
//! times and durations as tables show them, and the inline assets with the
//! Content-Security-Policy that allows only them (docs/report.md, "The page").

use serde::Serialize;

pub(crate) const UPLOT_JS: &str = include_str!("../../assets/uPlot.iife.min.js");
pub(crate) const UPLOT_CSS: &str = include_str!("../../assets/uPlot.min.css");
pub(crate) const PAGE_JS: &str = include_str!("../../assets/page.js");
pub(crate) const PAGE_CSS: &str = include_str!("../../assets/page.css");

/// Only inline scripts and styles, no request of any kind (connect, img, font, frame…).
pub(crate) const CSP: &str =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:";

/// `one` for 1, else `many`: "1 native window", "2 native windows".
pub(crate) fn plural<'a>(n: u64, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}

/// JSON for inside `<script type="application/json">`: `<`, `>` and `&` as `\u` escapes (so no
/// `</script>` or `<!--` can end or change the element), and U+2028 / U+2029 too (line ends to
/// old JavaScript parsers). These characters only ever occur inside JSON strings, where the
/// escapes mean the same.
pub fn script_json<T: Serialize>(v: &T) -> String {
    let s = serde_json::to_string(v).unwrap_or_else(|_| "{}".to_owned());
    let mut out = String::with_capacity(s.len() + 64);
    for c in s.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// HTML text and attribute escaping.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

pub(crate) fn list(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|x| esc(x)).collect();
    if items.is_empty() { "none".into() } else { items.join(", ") }
}

/// A whole number, "–" for none.
pub(crate) fn int<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "–".into(), |v| v.to_string())
}

/// A number for a table: 3 significant-ish digits, "–" for none or a non-finite one.
pub(crate) fn num(v: Option<f64>) -> String {
    match v.filter(|x| x.is_finite()) {
        None => "–".into(),
        Some(x) if x.abs() >= 1e9 => crate::reading::readable(x, None),
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.2}"),
    }
}

/// Epoch seconds as `YYYY-MM-DD HH:MM:SS.mmm UTC`.
pub(crate) fn utc(v: Option<f64>) -> String {
    let Some(t) = v.filter(|t| t.is_finite()) else { return "–".into() };
    let ms_total = (t * 1000.0).round() as i64;
    let (secs, ms) = (ms_total.div_euclid(1000), ms_total.rem_euclid(1000));
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, mo, d) = civil_from_days(days);
    format!("{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}.{ms:03} UTC", sod / 3600, sod % 3600 / 60, sod % 60)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

pub(crate) fn duration(v: Option<f64>) -> String {
    let Some(s) = v.filter(|s| s.is_finite()) else { return "–".into() };
    if s.abs() < 60.0 {
        return format!("{s:.2} s");
    }
    if s.abs() >= 1e9 {
        return format!("{} s", crate::reading::readable(s, None));
    }
    let whole = s.round() as i64;
    let (h, mi, se) = (whole / 3600, whole % 3600 / 60, whole % 60);
    if h > 0 { format!("{h} h {mi:02} min {se:02} s") } else { format!("{mi} min {se:02} s") }
}

/// A time as an offset from the job's start (`+1 min 02 s`).
pub(crate) fn offset(v: Option<f64>, t0: f64) -> String {
    match v {
        Some(t) => format!("+{}", duration(Some(t - t0))),
        None => "–".into(),
    }
}
