//! Statistics: quantiles (numpy's default, linear interpolation, as SageMaker's rules use),
//! histograms, a bounded percentage histogram for exact quantiles of any length of run, and
//! streaming decimation of series (`docs/report.md`, "`--json`").

/// The `q` quantile (0..=1) of sorted `v`, numpy's linear method; `None` when empty.
pub fn quantile_sorted(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    let frac = pos - lo as f64;
    Some(v[lo] + (v[hi] - v[lo]) * frac)
}

/// Sorted copy.
pub fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

pub fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Population standard deviation (numpy's `std`).
pub fn std(v: &[f64]) -> Option<f64> {
    let m = mean(v)?;
    Some((v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64).sqrt())
}

/// `bins` equal bins from min to max (numpy's `histogram`: the last bin includes max).
/// `len(edges) = len(counts) + 1`; empty input gives empty vectors.
pub fn histogram(v: &[f64], bins: usize) -> (Vec<f64>, Vec<u64>) {
    let (Some(lo), Some(hi)) =
        (v.iter().copied().min_by(f64::total_cmp), v.iter().copied().max_by(f64::total_cmp))
    else {
        return (Vec::new(), Vec::new());
    };
    let (lo, hi) = if hi > lo { (lo, hi) } else { (lo - 0.5, hi + 0.5) };
    let width = (hi - lo) / bins as f64;
    let edges: Vec<f64> = (0..=bins).map(|i| lo + width * i as f64).collect();
    let mut counts = vec![0u64; bins];
    for &x in v {
        let i = (((x - lo) / width) as usize).min(bins - 1);
        counts[i] += 1;
    }
    (edges, counts)
}

/// The step-time histogram (`docs/report.md`, `steps.<MODE>.histogram`): `bins` equal bins
/// from the shortest step to the longest, unless the longest is beyond 1.5 × p99; then
/// `bins - 1` equal bins up to 1.5 × p99 and one overflow bin from there to the longest, so a
/// few 10× outliers do not squeeze every other step into the first bin. `sorted`: ascending.
pub fn step_histogram(sorted: &[f64], bins: usize) -> (Vec<f64>, Vec<u64>) {
    let (Some(&lo), Some(&hi), Some(p99)) = (sorted.first(), sorted.last(), quantile_sorted(sorted, 0.99))
    else {
        return (Vec::new(), Vec::new());
    };
    let cap = 1.5 * p99;
    if bins < 2 || hi <= cap || cap <= lo {
        return histogram(sorted, bins);
    }
    let inner = bins - 1;
    let width = (cap - lo) / inner as f64;
    let mut edges: Vec<f64> = (0..=inner).map(|i| lo + width * i as f64).collect();
    edges.push(hi);
    let mut counts = vec![0u64; bins];
    for &x in sorted {
        let i = if x >= cap { inner } else { (((x - lo) / width) as usize).min(inner - 1) };
        counts[i] += 1;
    }
    (edges, counts)
}

/// Exact quantiles of percentages written with 2 decimals (as the agent writes them), in
/// constant memory: one counter per 0.01 from 0 to 100 (values outside are clamped, which
/// only a value that is not a percentage can be).
#[derive(Debug, Clone)]
pub struct PctHist {
    counts: Vec<u32>,
    n: u64,
}

impl Default for PctHist {
    fn default() -> Self {
        PctHist { counts: vec![0; 10_001], n: 0 }
    }
}

impl PctHist {
    pub fn add(&mut self, v: f64) {
        let i = (v.clamp(0.0, 100.0) * 100.0).round() as usize;
        self.counts[i] = self.counts[i].saturating_add(1);
        self.n += 1;
    }

    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The value at sorted index `k` (0-based).
    fn at(&self, k: u64) -> f64 {
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen > k {
                return i as f64 / 100.0;
            }
        }
        100.0
    }

    /// numpy's linear quantile over every value added.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let pos = q.clamp(0.0, 1.0) * (self.n - 1) as f64;
        let lo = pos.floor() as u64;
        let hi = pos.ceil() as u64;
        let (a, b) = (self.at(lo), self.at(hi));
        Some(a + (b - a) * (pos - lo as f64))
    }

    pub fn max(&self) -> Option<f64> {
        self.quantile(1.0)
    }

    /// Counts in SageMaker's LoadBalancing bins (`numpy.arange(0, 100, 2)` as edges: 49 bins
    /// of 2 from 0 to 98, the last closed; values above 98 fall outside, as there).
    pub fn load_bins(&self) -> Vec<f64> {
        let mut out = vec![0.0; 49];
        for (i, &c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let v = i as f64 / 100.0;
            if v > 98.0 {
                continue;
            }
            let b = ((v / 2.0) as usize).min(48);
            out[b] += f64::from(c);
        }
        out
    }
}

/// Jensen–Shannon distance between two histograms (each normalised), natural logarithm, as
/// `sqrt((entropy(p, m) + entropy(q, m)) / 2)` with scipy's `entropy`. `None` when either
/// is empty.
pub fn js_distance(p: &[f64], q: &[f64]) -> Option<f64> {
    let sp: f64 = p.iter().sum();
    let sq: f64 = q.iter().sum();
    if sp <= 0.0 || sq <= 0.0 || p.len() != q.len() {
        return None;
    }
    // scipy normalises m = (p + q) / 2 from the raw counts too.
    let m: Vec<f64> = p.iter().zip(q).map(|(a, b)| (a + b) / 2.0).collect();
    let sm: f64 = m.iter().sum();
    let kl = |x: &[f64], sx: f64| -> f64 {
        x.iter()
            .zip(&m)
            .map(|(a, b)| {
                let a = a / sx;
                let b = b / sm;
                if a > 0.0 { a * (a / b).ln() } else { 0.0 }
            })
            .sum()
    };
    Some(((kl(p, sp) + kl(q, sq)) / 2.0).max(0.0).sqrt())
}

/// Streaming decimation of rows on a time axis: rows are averaged into buckets of `width`
/// consecutive rows; when `cap` buckets are full, neighbours are merged and the width
/// doubles. Memory is `cap × columns` whatever the number of rows; the result has between
/// `cap / 2` and `cap` points (fewer when fewer rows came). A missing value (`None`) is left
/// out of its bucket's mean; a bucket with none stays `None`.
#[derive(Debug, Clone)]
pub struct Decimator {
    cap: usize,
    width: u64,
    buckets: Vec<Bucket>,
}

#[derive(Debug, Clone, Default)]
struct Bucket {
    t: f64,
    rows: u64,
    sums: Vec<(f64, u32)>,
}

impl Bucket {
    fn absorb(&mut self, other: &Bucket) {
        self.rows += other.rows;
        if self.sums.len() < other.sums.len() {
            self.sums.resize(other.sums.len(), (0.0, 0));
        }
        for (i, (s, n)) in other.sums.iter().enumerate() {
            self.sums[i].0 += s;
            self.sums[i].1 += n;
        }
    }
}

impl Decimator {
    pub fn new(cap: usize) -> Decimator {
        Decimator { cap: cap.max(2), width: 1, buckets: Vec::new() }
    }

    /// Adds one row at time `t` (rows come in time order): `row` holds `(column, value)` for
    /// the columns that have a value, so a row costs what it holds, not every column seen.
    pub fn push(&mut self, t: f64, row: &[(usize, f64)]) {
        let start_new = self.buckets.last().is_none_or(|b| b.rows >= self.width);
        if start_new {
            if self.buckets.len() >= self.cap {
                self.halve();
            }
            if self.buckets.last().is_none_or(|b| b.rows >= self.width) {
                self.buckets.push(Bucket { t, ..Bucket::default() });
            }
        }
        let Some(b) = self.buckets.last_mut() else { return };
        b.rows += 1;
        for &(i, v) in row {
            if b.sums.len() <= i {
                b.sums.resize(i + 1, (0.0, 0));
            }
            b.sums[i].0 += v;
            b.sums[i].1 += 1;
        }
    }

    /// Lowers the number of points kept to at most `cap` (≥ 2), merging neighbours as when
    /// the buckets are full: a node with many columns keeps fewer points, so the cells of all
    /// series stay bounded (`docs/report.md`, "Caps").
    pub fn set_cap(&mut self, cap: usize) {
        self.cap = cap.max(2);
        while self.buckets.len() > self.cap {
            self.halve();
        }
    }

    /// Merges neighbouring buckets and doubles the width.
    fn halve(&mut self) {
        let old = std::mem::take(&mut self.buckets);
        for pair in old.chunks(2) {
            let mut b = pair[0].clone();
            if let Some(o) = pair.get(1) {
                b.absorb(o);
            }
            self.buckets.push(b);
        }
        self.width *= 2;
    }

    /// Points kept now.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Sums held (points × the columns each has seen): the decimator's memory.
    pub fn cells(&self) -> usize {
        self.buckets.iter().map(|b| b.sums.len()).sum()
    }

    /// The time axis (each bucket's first row's time) and the columns' means.
    pub fn finish(&self, columns: usize) -> (Vec<f64>, Vec<Vec<Option<f64>>>) {
        let t = self.buckets.iter().map(|b| b.t).collect();
        let cols = (0..columns)
            .map(|i| {
                self.buckets
                    .iter()
                    .map(|b| match b.sums.get(i) {
                        Some(&(s, n)) if n > 0 => Some(s / f64::from(n)),
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        (t, cols)
    }
}

/// Min/max decimation of a step series to at most `cap` points: each bucket of consecutive
/// steps keeps its shortest and its longest step (in time order), so an outlier always
/// shows. `cap` ≥ 2.
pub fn minmax_decimate(t: &[f64], v: &[f64], cap: usize) -> (Vec<f64>, Vec<f64>) {
    if t.len() <= cap {
        return (t.to_vec(), v.to_vec());
    }
    let buckets = (cap / 2).max(1);
    let per = t.len().div_ceil(buckets);
    let (mut ot, mut ov) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
    for start in (0..t.len()).step_by(per) {
        let end = (start + per).min(t.len());
        let slice = &v[start..end];
        let (mut imin, mut imax) = (0, 0);
        for (i, x) in slice.iter().enumerate() {
            if *x < slice[imin] {
                imin = i;
            }
            if *x > slice[imax] {
                imax = i;
            }
        }
        let (a, b) = if imin <= imax { (imin, imax) } else { (imax, imin) };
        ot.push(t[start + a]);
        ov.push(v[start + a]);
        if b != a {
            ot.push(t[start + b]);
            ov.push(v[start + b]);
        }
    }
    (ot, ov)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_match_numpy_linear() {
        let v = sorted(&[1.0, 2.0, 3.0, 4.0]);
        // numpy.quantile([1,2,3,4], 0.5) = 2.5, 0.9 = 3.7, 0.99 = 3.97
        assert_eq!(quantile_sorted(&v, 0.5), Some(2.5));
        assert!((quantile_sorted(&v, 0.9).unwrap() - 3.7).abs() < 1e-12);
        assert!((quantile_sorted(&v, 0.99).unwrap() - 3.97).abs() < 1e-12);
        assert_eq!(quantile_sorted(&[], 0.5), None);
        assert_eq!(std(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]), Some(2.0));
    }

    #[test]
    fn pct_hist_is_exact_for_two_decimals() {
        let vals = [3.0, 87.5, 10.25, 10.25, 99.99, 0.0, 55.55];
        let mut h = PctHist::default();
        for v in vals {
            h.add(v);
        }
        let s = sorted(&vals);
        for q in [0.0, 0.05, 0.5, 0.95, 1.0] {
            assert!((h.quantile(q).unwrap() - quantile_sorted(&s, q).unwrap()).abs() < 1e-9, "{q}");
        }
        assert_eq!(h.len(), 7);
    }

    #[test]
    fn step_histogram_puts_far_outliers_in_one_overflow_bin() {
        // 200 steps spread over 10-20 ms and two of 150 ms.
        let mut v: Vec<f64> = (0..200).map(|i| 10.0 + f64::from(i) * 0.05).collect();
        v.extend([150.0, 150.0]);
        let v = sorted(&v);
        let (e, c) = step_histogram(&v, 30);
        assert_eq!((e.len(), c.len()), (31, 30));
        assert_eq!(c.iter().sum::<u64>(), 202);
        assert_eq!(*e.last().unwrap(), 150.0);
        assert_eq!(c[29], 2);
        let p99 = quantile_sorted(&v, 0.99).unwrap();
        assert!((e[29] - 1.5 * p99).abs() < 1e-9);
        // The ordinary steps fill the 29 regular bins, none holds most of them.
        assert!(c[..29].iter().all(|&n| n < 20), "{c:?}");
        assert!(e.windows(2).all(|w| w[0] < w[1]));
        // Without far outliers: the plain equal bins.
        let plain = sorted(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(step_histogram(&plain, 30), histogram(&plain, 30));
    }

    #[test]
    fn histogram_edges_and_counts() {
        let (e, c) = histogram(&[0.0, 1.0, 2.0, 10.0], 10);
        assert_eq!(e.len(), 11);
        assert_eq!(c.iter().sum::<u64>(), 4);
        assert_eq!(c[9], 1);
        assert_eq!(c[0], 1);
        assert_eq!(c[2], 1);
        let (e, c) = histogram(&[5.0, 5.0], 4);
        assert_eq!((e.len(), c.iter().sum::<u64>()), (5, 2));
    }

    #[test]
    fn js_distance_is_zero_for_equal_and_one_for_disjoint() {
        assert_eq!(js_distance(&[1.0, 2.0], &[2.0, 4.0]), Some(0.0));
        let d = js_distance(&[1.0, 0.0], &[0.0, 1.0]).unwrap();
        assert!((d - 2f64.ln().sqrt()).abs() < 1e-12, "{d}");
        assert_eq!(js_distance(&[0.0], &[1.0]), None);
    }

    #[test]
    fn decimator_stays_bounded_and_keeps_means() {
        let mut d = Decimator::new(100);
        for i in 0..100_000 {
            let row = [(0, 1.0), (1, i as f64)];
            d.push(i as f64, if i % 2 == 0 { &row } else { &row[..1] });
        }
        let (t, cols) = d.finish(2);
        assert!(t.len() <= 100 && t.len() >= 50, "{}", t.len());
        assert_eq!(cols[0].len(), t.len());
        assert!(cols[0].iter().all(|v| *v == Some(1.0)));
        assert!(t.windows(2).all(|w| w[0] < w[1]));
        // Few rows: kept as they came.
        let mut d = Decimator::new(100);
        d.push(1.0, &[]);
        d.push(2.0, &[(0, 3.0)]);
        assert_eq!(d.finish(1), (vec![1.0, 2.0], vec![vec![None, Some(3.0)]]));
    }

    #[test]
    fn a_lower_cap_merges_points_and_keeps_means() {
        let mut d = Decimator::new(2000);
        for i in 0..2000 {
            d.push(f64::from(i), &[(0, 2.0), (3, f64::from(i % 2))]);
        }
        assert_eq!(d.finish(4).0.len(), 2000);
        d.set_cap(300);
        let (t, cols) = d.finish(4);
        assert!(t.len() <= 300 && t.len() >= 150, "{}", t.len());
        assert!(cols[0].iter().all(|v| *v == Some(2.0)));
        assert!(cols[1].iter().all(Option::is_none));
        assert!(cols[3].iter().all(|v| *v == Some(0.5)), "{:?}", &cols[3][..4]);
        // Rows keep coming at the lower cap.
        for i in 2000..10_000 {
            d.push(f64::from(i), &[(0, 2.0)]);
        }
        assert!(d.finish(4).0.len() <= 300);
    }

    #[test]
    fn minmax_keeps_the_outlier() {
        let t: Vec<f64> = (0..10_000).map(f64::from).collect();
        let mut v = vec![1.0; 10_000];
        v[7777] = 500.0;
        let (dt, dv) = minmax_decimate(&t, &v, 400);
        assert!(dt.len() <= 400);
        assert!(dv.contains(&500.0));
        assert!(dt.contains(&7777.0));
    }
}
