//! The two formats a scrape may ask for (`docs/metrics.md`, "Formats") and the label
//! escaping both share: what the system rows ([`super::exposition`]) and the trainer's
//! steps ([`super::progress`]) are rendered with.

/// Which format a scrape asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`.
    Text,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// The format the `Accept` header prefers (`docs/metrics.md`, "Formats"): each media range
    /// with its `q` (1 when not given); a format takes the `q` of the most specific range that
    /// matches it (`application/openmetrics-text` before `application/*` before `*/*`; of
    /// equally specific ones, the highest), and
    /// `q=0` means "not acceptable". The higher `q` wins; at a tie OpenMetrics when named by
    /// its own type (Prometheus asks for it first), else the text format. `None` (406) when
    /// the header refuses both with `q=0` and accepts neither; a header that matches neither
    /// format at all (`application/json`) is disregarded, as RFC 9110 allows: text.
    ///
    /// Hand-written: none of the crates the agent builds parses `Accept` lists with their
    /// `q` values (hyper and `http` leave header values as bytes).
    pub fn from_accept(accept: Option<&str>) -> Option<Format> {
        let Some(accept) = accept else { return Some(Format::Text) };
        // Per format: (specificity, q) of the most specific range that matched (2: its own
        // type, 1: `type/*`, 0: `*/*`).
        let mut text: Option<(u8, f64)> = None;
        let mut open: Option<(u8, f64)> = None;
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let mut q = 1.0;
            for p in parts {
                if let Some((k, v)) = p.split_once('=')
                    && k.trim().eq_ignore_ascii_case("q")
                {
                    // A q that does not parse, or is out of 0..=1, makes the range count as
                    // not acceptable rather than preferred.
                    q = v.trim().parse::<f64>().ok().filter(|q| (0.0..=1.0).contains(q)).unwrap_or(0.0);
                }
            }
            let specificity = |ty: &str| -> Option<u8> {
                let (main, _) = ty.split_once('/')?;
                if media == ty {
                    Some(2)
                } else if media.strip_suffix("/*") == Some(main) {
                    Some(1)
                } else if media == "*/*" {
                    Some(0)
                } else {
                    None
                }
            };
            for (slot, ty) in [(&mut text, "text/plain"), (&mut open, "application/openmetrics-text")] {
                // Of equally specific ranges (the same type with other parameters, such as
                // Prometheus's two OpenMetrics versions) the highest `q`.
                if let Some(sp) = specificity(ty)
                    && slot.is_none_or(|(s, old)| sp > s || (sp == s && q > old))
                {
                    *slot = Some((sp, q));
                }
            }
        }
        let q = |f: Option<(u8, f64)>| f.map_or(0.0, |(_, q)| q);
        match (q(text), q(open)) {
            (t, o) if o > t || (o == t && o > 0.0 && open.is_some_and(|(s, _)| s == 2)) => {
                Some(Format::OpenMetrics)
            }
            (t, _) if t > 0.0 => Some(Format::Text),
            // Both refused or absent: refused only when one was refused by name or wildcard.
            _ if text.is_none() && open.is_none() => Some(Format::Text),
            _ => None,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// A label value with `\`, `"` and newlines escaped (both formats' rule).
pub fn escaped(buf: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\\' => buf.push_str("\\\\"),
            '"' => buf.push_str("\\\""),
            '\n' => buf.push_str("\\n"),
            c => buf.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut buf = String::new();
        escaped(&mut buf, "a\"b\\c\nd");
        assert_eq!(buf, "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn accept_headers() {
        assert_eq!(Format::from_accept(None), Some(Format::Text));
        assert_eq!(Format::from_accept(Some("text/plain")), Some(Format::Text));
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::from_accept(Some(prometheus)), Some(Format::OpenMetrics));
    }

    #[test]
    fn q_zero_in_accept_is_not_acceptable() {
        use Format::{OpenMetrics, Text};
        for (accept, want) in [
            // Named, then refused: the other format.
            ("application/openmetrics-text;q=0, text/plain", Some(Text)),
            ("application/openmetrics-text; q=0.0, text/*", Some(Text)),
            // Refused by name and text not named: nothing acceptable.
            ("application/openmetrics-text; q=0.0", None),
            ("application/openmetrics-text;version=1.0.0;q=0,*/*", Some(Text)),
            ("text/plain;q=0, application/openmetrics-text", Some(OpenMetrics)),
            ("text/plain;q=0, */*", Some(OpenMetrics)),
            ("text/*;q=0, */*;q=0.5", Some(OpenMetrics)),
            // The more specific range wins over a wildcard.
            ("*/*;q=0, text/plain", Some(Text)),
            ("*/*;q=0, application/openmetrics-text;q=0.2", Some(OpenMetrics)),
            // Everything refused: 406.
            ("*/*;q=0", None),
            ("text/plain;q=0", None),
            ("text/plain;q=0, application/openmetrics-text;q=0", None),
            ("application/json, text/plain;q=0", None),
            // The higher q wins; a tie goes to OpenMetrics only when named.
            ("text/plain;q=0.9, application/openmetrics-text;q=0.5", Some(Text)),
            ("text/plain;q=0.5, application/openmetrics-text;q=0.5", Some(OpenMetrics)),
            ("*/*", Some(Text)),
            ("application/*", Some(OpenMetrics)),
            // Of equally specific ranges, the highest q; Prometheus 3's header.
            (
                "application/openmetrics-text;version=0.0.1;q=0,application/openmetrics-text;version=1.0.0",
                Some(OpenMetrics),
            ),
            (
                "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
                Some(OpenMetrics),
            ),
            // Matching neither: the header is disregarded.
            ("application/json", Some(Text)),
            ("", Some(Text)),
            // A q that does not parse counts as 0.
            ("application/openmetrics-text;q=high, text/plain;q=0.1", Some(Text)),
            ("TEXT/PLAIN;Q=0, Application/OpenMetrics-Text", Some(OpenMetrics)),
        ] {
            assert_eq!(Format::from_accept(Some(accept)), want, "{accept}");
        }
    }
}
