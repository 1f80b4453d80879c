//! The statistics of `trainprof compare` (docs/report.md, "compare"): the ratio of two
//! medians with a percentile-bootstrap confidence interval drawn with a fixed seed, and the
//! verdict in words. Pure; the unit tests check them on distributions with known answers.

use crate::analysis::stats::quantile_sorted;

/// Bootstrap resamples.
pub const RESAMPLES: usize = 2000;
/// The seed of every bootstrap: the same inputs always give the same interval.
pub const SEED: u64 = 0x7472_6169_6e70_726f;
/// The confidence level of the interval.
pub const LEVEL: f64 = 0.95;
/// At most this many values of a side are resampled: past it, every k-th value of the
/// sorted sample (k = ⌈n / MAX_RESAMPLED⌉) is resampled at its own weight. The median is
/// the same to within one value's gap, and the interval only wider (conservative): an hour
/// of 8 ranks at 10 steps a second is 288,000 steps, and 2 × 2000 resamples of all of them
/// would take seconds.
pub const MAX_RESAMPLED: usize = 20_000;

/// SplitMix64: small, fast, and enough for resampling indices.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by Lemire's multiply-shift (bias below 2^-32 for the
    /// sizes here).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The median of `sorted` (numpy's: the mean of the two middle values for an even count).
pub fn median(sorted: &[f64]) -> Option<f64> {
    quantile_sorted(sorted, 0.5)
}

/// `sorted` itself, or every k-th value of it when it holds more than [`MAX_RESAMPLED`].
fn thinned(sorted: &[f64]) -> Vec<f64> {
    if sorted.len() <= MAX_RESAMPLED {
        return sorted.to_vec();
    }
    let k = sorted.len().div_ceil(MAX_RESAMPLED);
    // Centred in each group of k, so the thinned median stays the sample's.
    sorted.iter().skip(k / 2).step_by(k).copied().collect()
}

/// The median of one resample (with replacement) of `sorted`, using `idx` as scratch.
fn resample_median(sorted: &[f64], rng: &mut Rng, idx: &mut Vec<usize>) -> f64 {
    let n = sorted.len();
    idx.clear();
    idx.extend((0..n).map(|_| rng.below(n)));
    // The values are sorted, so the resample's order statistics are its indices'.
    let mid = n / 2;
    let (lower, &mut m, _) = idx.select_nth_unstable(mid);
    if n % 2 == 1 {
        sorted[m]
    } else {
        let below = lower.iter().copied().max().unwrap_or(m);
        (sorted[below] + sorted[m]) / 2.0
    }
}

/// The ratio B ÷ A of the medians, with its interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
}

/// The ratio of the medians of `b` and `a` (both sorted, non-empty, positive medians) and
/// its percentile-bootstrap interval at [`LEVEL`]: each side resampled with replacement
/// [`RESAMPLES`] times (independently: the two runs are independent), the ratio of the
/// resamples' medians each time, and the 2.5th and 97.5th percentiles of those ratios.
/// `None` when either side is empty or either median is not positive (B's median of 0 is no
/// more "100 % faster" than A's is "infinitely slower").
pub fn median_ratio(a: &[f64], b: &[f64], resamples: usize, seed: u64) -> Option<Ratio> {
    let (ma, mb) = (median(a)?, median(b)?);
    if ma <= 0.0 || mb <= 0.0 || !mb.is_finite() || !ma.is_finite() {
        return None;
    }
    let (ta, tb) = (thinned(a), thinned(b));
    let mut rng = Rng::new(seed);
    let mut idx = Vec::with_capacity(ta.len().max(tb.len()));
    let mut ratios = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        let ra = resample_median(&ta, &mut rng, &mut idx);
        let rb = resample_median(&tb, &mut rng, &mut idx);
        if ra > 0.0 {
            ratios.push(rb / ra);
        }
    }
    ratios.sort_by(f64::total_cmp);
    let tail = (1.0 - LEVEL) / 2.0;
    Some(Ratio {
        ratio: mb / ma,
        lo: quantile_sorted(&ratios, tail)?,
        hi: quantile_sorted(&ratios, 1.0 - tail)?,
    })
}

/// What the step times say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Slower,
    Faster,
    /// No difference beyond noise: the interval holds 1, or the change is under the
    /// practical threshold.
    Same,
}

/// The verdict on `r` with the practical threshold `noise_pct` (per cent): slower (faster)
/// when the whole interval is above (below) 1 and the change is larger than the threshold;
/// else the same.
pub fn verdict(r: &Ratio, noise_pct: f64) -> Verdict {
    let change = (r.ratio - 1.0) * 100.0;
    if r.lo > 1.0 && change > noise_pct {
        Verdict::Slower
    } else if r.hi < 1.0 && -change > noise_pct {
        Verdict::Faster
    } else {
        Verdict::Same
    }
}

/// A percentage with one decimal (scientific from a billion up, [`crate::reading::readable`]);
/// `-0.0` written as `0.0`.
pub fn pct(x: f64) -> String {
    let s = crate::reading::readable(x, Some(1));
    if s == "-0.0" { "0.0".into() } else { s }
}

/// The verdict in words, e.g. `B is 9.8 % slower (95 % CI 8.9–10.7 %)` or
/// `no difference beyond noise (±0.6 %)`; for a change the interval shows as detectable but
/// under the threshold, the words say so.
pub fn verdict_text(r: &Ratio, noise_pct: f64) -> String {
    let (c, lo, hi) = ((r.ratio - 1.0) * 100.0, (r.lo - 1.0) * 100.0, (r.hi - 1.0) * 100.0);
    let level = (LEVEL * 100.0).round();
    match verdict(r, noise_pct) {
        Verdict::Slower => format!("B is {} % slower ({level} % CI {}–{} %)", pct(c), pct(lo), pct(hi)),
        Verdict::Faster => format!("B is {} % faster ({level} % CI {}–{} %)", pct(-c), pct(-hi), pct(-lo)),
        Verdict::Same => {
            let w = lo.abs().max(hi.abs());
            if lo > 0.0 || hi < 0.0 {
                format!(
                    "no difference beyond noise (±{} %): the {}{} % change is under the {} % threshold",
                    pct(w),
                    if c > 0.0 { "+" } else { "" },
                    pct(c),
                    pct(noise_pct)
                )
            } else {
                format!("no difference beyond noise (±{} %)", pct(w))
            }
        }
    }
}

/// The CI gate: fails when B's median is slower by more than `pct` per cent *and* the
/// interval excludes that figure (its lower end is above it).
pub fn gate_fails(r: &Ratio, pct: f64) -> bool {
    let limit = 1.0 + pct / 100.0;
    r.ratio > limit && r.lo > limit
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Standard normal by Box–Muller.
    fn normal(rng: &mut Rng) -> f64 {
        let u1 = rng.unit().max(1e-300);
        let u2 = rng.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    fn sample(rng: &mut Rng, n: usize, f: impl Fn(&mut Rng) -> f64) -> Vec<f64> {
        let mut v: Vec<f64> = (0..n).map(|_| f(rng)).collect();
        v.sort_by(f64::total_cmp);
        v
    }

    #[test]
    fn the_generator_is_uniform_enough() {
        let mut rng = Rng::new(1);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[rng.below(10)] += 1;
        }
        assert!(counts.iter().all(|&c| (9_500..10_500).contains(&c)), "{counts:?}");
        let mean: f64 = (0..100_000).map(|_| rng.unit()).sum::<f64>() / 100_000.0;
        assert!((mean - 0.5).abs() < 0.005);
    }

    #[test]
    fn a_scaled_copy_has_its_scale_as_ratio() {
        // B is A × 1.1 exactly: the ratio of medians is 1.1 and every resample pair is drawn
        // independently, so the interval holds 1.1 and is narrow for 1001 evenly spread values.
        let a: Vec<f64> = (0..1001).map(|i| 100.0 + f64::from(i) * 0.01).collect();
        let b: Vec<f64> = a.iter().map(|x| x * 1.1).collect();
        let r = median_ratio(&a, &b, RESAMPLES, SEED).unwrap();
        assert!((r.ratio - 1.1).abs() < 1e-12);
        assert!(r.lo < 1.1 && r.hi > 1.1, "{r:?}");
        assert!(r.hi - r.lo < 0.01, "{r:?}");
        assert_eq!(verdict(&r, 1.0), Verdict::Slower);
        assert!(
            verdict_text(&r, 1.0).starts_with("B is 10.0 % slower (95 % CI "),
            "{}",
            verdict_text(&r, 1.0)
        );
        // The same samples: ratio 1, "no difference".
        let r = median_ratio(&a, &a, RESAMPLES, SEED).unwrap();
        assert_eq!(r.ratio, 1.0);
        assert!(r.lo <= 1.0 && r.hi >= 1.0);
        assert_eq!(verdict(&r, 1.0), Verdict::Same);
        assert!(verdict_text(&r, 1.0).starts_with("no difference beyond noise (±"));
    }

    #[test]
    fn the_interval_is_reproducible() {
        let mut rng = Rng::new(7);
        let a = sample(&mut rng, 500, |r| 50.0 + 5.0 * normal(r));
        let b = sample(&mut rng, 500, |r| 52.0 + 5.0 * normal(r));
        assert_eq!(median_ratio(&a, &b, 500, SEED), median_ratio(&a, &b, 500, SEED));
    }

    /// Normal samples, σ = 5 around 100 and 110: the median's standard error is
    /// √(π/2) · σ / √n, so for n = 400 the interval of the ratio is about
    /// 1.1 · (1 ± 1.96 · √2 · 0.313 / 105) ≈ ±0.9 %, and it covers the true 1.1 in about 95 % of
    /// samples. 200 pairs of samples: the coverage is between 88 and 99 % (a binomial(200,
    /// 0.95) falls outside that with probability < 0.1 %), and the mean width as computed.
    #[test]
    fn the_interval_covers_the_true_ratio_about_95_percent_of_the_time() {
        let mut rng = Rng::new(42);
        let (mut covered, mut width) = (0, 0.0);
        for k in 0..200u64 {
            let a = sample(&mut rng, 400, |r| 100.0 + 5.0 * normal(r));
            let b = sample(&mut rng, 400, |r| 110.0 + 5.0 * normal(r));
            let r = median_ratio(&a, &b, 400, SEED ^ k).unwrap();
            covered += usize::from(r.lo <= 1.1 && 1.1 <= r.hi);
            width += (r.hi - r.lo) / 200.0;
        }
        assert!((176..=198).contains(&covered), "covered {covered} of 200");
        let expect =
            2.0 * 1.96 * 1.1 * (2.0f64).sqrt() * (std::f64::consts::PI / 2.0).sqrt() * 5.0 / 20.0 / 105.0;
        assert!((width / expect - 1.0).abs() < 0.25, "width {width}, expected about {expect}");
    }

    /// Exponential samples (a long right tail, like step times with stalls) with medians
    /// ln 2 · 10 and ln 2 · 10.5: the ratio is 1.05 and the interval holds it.
    #[test]
    fn a_skewed_distribution_keeps_its_median_ratio() {
        let mut rng = Rng::new(3);
        let a = sample(&mut rng, 20_000, |r| -10.0 * (1.0 - r.unit()).ln());
        let b = sample(&mut rng, 20_000, |r| -10.5 * (1.0 - r.unit()).ln());
        let r = median_ratio(&a, &b, 1000, SEED).unwrap();
        assert!(r.lo < 1.05 && 1.05 < r.hi, "{r:?}");
        assert!((r.ratio - 1.05).abs() < 0.03, "{r:?}");
    }

    #[test]
    fn large_samples_are_thinned_and_stay_centred() {
        let a: Vec<f64> = (0..100_000).map(|i| f64::from(i) / 1000.0).collect();
        let t = thinned(&a);
        assert!(t.len() <= MAX_RESAMPLED);
        let (m, mt) = (median(&a).unwrap(), median(&t).unwrap());
        assert!((m - mt).abs() <= 0.005, "{m} {mt}");
        let b: Vec<f64> = a.iter().map(|x| x * 1.02 + 1.0).collect();
        let r = median_ratio(&a, &b, 200, SEED).unwrap();
        assert!(r.lo < r.ratio && r.ratio < r.hi);
    }

    #[test]
    fn verdicts_follow_the_interval_and_the_threshold() {
        let r = |ratio, lo, hi| Ratio { ratio, lo, hi };
        assert_eq!(verdict_text(&r(1.098, 1.089, 1.107), 1.0), "B is 9.8 % slower (95 % CI 8.9–10.7 %)");
        assert_eq!(verdict_text(&r(0.9, 0.88, 0.92), 1.0), "B is 10.0 % faster (95 % CI 8.0–12.0 %)");
        assert_eq!(verdict_text(&r(1.001, 0.995, 1.006), 1.0), "no difference beyond noise (±0.6 %)");
        // Detectable, but under the practical threshold.
        let small = r(1.008, 1.005, 1.011);
        assert_eq!(verdict(&small, 1.0), Verdict::Same);
        assert_eq!(
            verdict_text(&small, 1.0),
            "no difference beyond noise (±1.1 %): the +0.8 % change is under the 1.0 % threshold"
        );
        assert_eq!(verdict(&small, 0.5), Verdict::Slower);
        // Above the threshold but the interval holds 1: not a change.
        assert_eq!(verdict(&r(1.05, 0.99, 1.11), 1.0), Verdict::Same);
    }

    #[test]
    fn the_gate_needs_the_interval_past_the_limit() {
        let r = |ratio, lo, hi| Ratio { ratio, lo, hi };
        assert!(gate_fails(&r(1.098, 1.089, 1.107), 5.0));
        // Slower by more than 5 %, but the interval reaches below 5 %.
        assert!(!gate_fails(&r(1.06, 1.04, 1.08), 5.0));
        assert!(!gate_fails(&r(1.02, 1.01, 1.03), 5.0));
        assert!(!gate_fails(&r(0.8, 0.7, 0.9), 5.0));
    }

    #[test]
    fn empty_or_zero_samples_give_no_ratio() {
        assert!(median_ratio(&[], &[1.0], 10, SEED).is_none());
        assert!(median_ratio(&[0.0, 0.0], &[1.0], 10, SEED).is_none());
        // B's median of 0 is refused as A's is, not "100 % faster".
        assert!(median_ratio(&[1.0], &[0.0, 0.0], 10, SEED).is_none());
    }
}
