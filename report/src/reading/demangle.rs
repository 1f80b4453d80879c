//! Mangled names as shown (`docs/report.md`, "Mangled names"): the native windows' functions
//! and the detailed windows' kernels (CUPTI reports some CUTLASS and cuDNN kernels mangled,
//! `_ZN17cutlass…`) are demangled by `symbolic-demangle` (C++ through `cpp_demangle`, and Rust),
//! within a budget per job: at most [`BUDGET_BYTES`] of mangled names are given to it, names
//! longer than [`MAX_NAME`] never are, and after [`MAX_FAILURES`] names it could not read it is
//! given none. A demangler that parses the whole name costs up to a millisecond on a hostile
//! one (symbolic-demangle bounds its output, not its parsing), so without the budget a timeline
//! of 20,000 such names took 10× as long to report (BENCHMARKS.md, "Demangling budget").
//!
//! A name the demangler did not read (failed, past the budget, cut by whoever wrote it) is shown
//! by [`readable_prefix`]: its scopes and name up to where it stops being plain
//! (`cutlass__5x_cudnn::Kernel<…>`), else its first [`SHORT`] bytes and `…`; never as the whole
//! raw mangling.

use std::borrow::Cow;

/// Bytes of mangled names given to the demangler per job (thousands of typical C++ names, or
/// 600 CUTLASS kernels of 1.7 KB).
pub const BUDGET_BYTES: usize = 1 << 20;
/// Names the demangler could not read before it is given no more.
pub const MAX_FAILURES: u32 = 64;
/// A mangled name is read up to this many bytes (a demangled C++ name is at most 4,096).
pub const MAX_NAME: usize = 4096;
/// Bytes of a mangled name shown when nothing of it is readable.
pub const SHORT: usize = 48;

/// `_Z…` (C++, Itanium ABI; `__Z…` on macOS) or `_R…` (Rust v0).
pub fn is_mangled(raw: &str) -> bool {
    raw.starts_with("_Z") || raw.starts_with("_R") || raw.starts_with("__Z")
}

/// One job's demangling: its budget and what was spent.
#[derive(Debug)]
pub struct Demangler {
    bytes_left: usize,
    failures_left: u32,
    /// Names given to the demangler, and their bytes.
    pub attempts: u64,
    pub attempted_bytes: u64,
    /// Of those, names it could not read.
    pub failed: u64,
    /// Mangled names not given to it (past the budget, after the failures, or too long): shown
    /// by their readable prefix.
    pub not_tried: u64,
}

impl Default for Demangler {
    fn default() -> Self {
        Demangler::with_budget(BUDGET_BYTES, MAX_FAILURES)
    }
}

impl Demangler {
    pub fn with_budget(bytes: usize, failures: u32) -> Demangler {
        Demangler {
            bytes_left: bytes,
            failures_left: failures,
            attempts: 0,
            attempted_bytes: 0,
            failed: 0,
            not_tried: 0,
        }
    }

    /// Whether [`Demangler::show`] would give `raw` to the demangler (a mangled name within the
    /// budget): its answer is then worth keeping under the raw name, and those names' bytes
    /// are at most the budget.
    pub fn would_try(&self, raw: &str) -> bool {
        is_mangled(raw) && raw.len() <= MAX_NAME && raw.len() <= self.bytes_left && self.failures_left > 0
    }

    /// `raw` as shown: demangled when mangled and within the budget, else its readable prefix;
    /// control characters as escapes, cut to `max` bytes (then `…`).
    pub fn show(&mut self, raw: &str, max: usize) -> String {
        if !is_mangled(raw) {
            return crate::reading::printable(raw, max);
        }
        if self.would_try(raw) {
            self.bytes_left -= raw.len();
            self.attempts += 1;
            self.attempted_bytes += raw.len() as u64;
            // symbolic-demangle gives the name back borrowed when it could not demangle it.
            if let Cow::Owned(d) = symbolic_demangle::demangle(raw) {
                return crate::reading::printable(&d, max);
            }
            self.failed += 1;
            self.failures_left -= 1;
        } else {
            self.not_tried += 1;
        }
        crate::reading::printable(&readable_prefix(raw), max)
    }
}

/// What can be read of a mangled name without demangling it: for a C++ name its scopes and
/// name (`_ZN17cutlass__5x_cudnn6KernelINS_4conv…` → `cutlass__5x_cudnn::Kernel<…>`; `…` where
/// more follows), else (nothing readable, a Rust v0 name) its first [`SHORT`] bytes and `…`.
///
/// Hand-written, linear in the name: `cpp_demangle` reads a whole name or nothing, so a name
/// cut by its writer, or one past its bounds, would otherwise be shown raw.
pub fn readable_prefix(raw: &str) -> String {
    if let Some(p) = itanium_prefix(raw.as_bytes()) {
        return p;
    }
    let mut end = SHORT.min(raw.len());
    while !raw.is_char_boundary(end) {
        end -= 1;
    }
    if end < raw.len() { format!("{}…", &raw[..end]) } else { raw.to_owned() }
}

/// The Itanium ABI's `<nested-name>` or `<unscoped-name>` at the start of `_Z<encoding>`, as far
/// as it is source names (`<length><identifier>`), `St`, constructors and destructors: `None`
/// when there is not one source name.
fn itanium_prefix(raw: &[u8]) -> Option<String> {
    let mut b = raw.strip_prefix(b"__Z").or_else(|| raw.strip_prefix(b"_Z"))?;
    let nested = b.first() == Some(&b'N');
    if nested {
        b = &b[1..];
        // CV- and ref-qualifiers of a member function.
        while let Some(b'r' | b'V' | b'K' | b'R' | b'O') = b.first() {
            b = &b[1..];
        }
    } else if b.first() == Some(&b'L') {
        b = &b[1..];
    }
    let mut parts: Vec<String> = Vec::new();
    let mut tail = "";
    loop {
        match b {
            [b'1'..=b'9', ..] => {
                let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
                let rest = &b[digits..];
                let n = std::str::from_utf8(&b[..digits]).ok().and_then(|d| d.parse::<usize>().ok());
                match n {
                    Some(n) if n <= rest.len() => {
                        parts.push(String::from_utf8_lossy(&rest[..n]).into_owned());
                        b = &rest[n..];
                    }
                    // The name is cut inside this identifier: what there is of it.
                    _ => {
                        if !rest.is_empty() {
                            parts.push(String::from_utf8_lossy(rest).into_owned());
                        }
                        tail = "…";
                        break;
                    }
                }
                if !nested {
                    break;
                }
            }
            [b'S', b't', rest @ ..] => {
                parts.push("std".into());
                b = rest;
            }
            [b'C', b'1'..=b'3', rest @ ..] if !parts.is_empty() => {
                let last = parts[parts.len() - 1].clone();
                parts.push(last);
                b = rest;
            }
            [b'D', b'0'..=b'2', rest @ ..] if !parts.is_empty() => {
                let last = format!("~{}", parts[parts.len() - 1]);
                parts.push(last);
                b = rest;
            }
            _ => break,
        }
    }
    if parts.is_empty() {
        return None;
    }
    if tail.is_empty() {
        tail = match b {
            [b'I', ..] => "<…>",
            // The end of a nested name, then its parameters.
            b"E" if nested => "",
            b"Ev" if nested => "()",
            [b'E', ..] if nested => "(…)",
            // A nested name without its end is cut.
            [] if nested => "…",
            [] => "",
            _ => "…",
        };
    }
    Some(parts.join("::") + tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H200 fixture's CUTLASS kernel, which no demangler reads (nor `c++filt`).
    pub(super) const CUTLASS: &str = "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemmMultistageINS_4gemm9GemmShapeILi64ELi128ELi32EEENS4_52Conv2dWgradOutputGradientTileAccessIteratorOptimizedINS_11MatrixShapeILi64ELi32EEENS_10bfloat16_tENS_9transform29PitchLinearWarpRakedThreadMapINS_16PitchLinearShapeILi64ELi32EEELi128ENSF_ILi8ELi4EEELi8EEENS_12AlignedArrayISC_Li8ELi16EEEEENSD_11threadblock25RegularTileAccessIteratorISB_SC_NS_6layout40ColumnMajorTensorOpMultiplicandCongruousILi16ELi64EEELi1ESI_Li16EEELNS_4arch14CacheOperation4KindE0ENS4_48Conv2dWgradActivationTileAccessIteratorOptimizedINSA_ILi32ELi128EEESC_NSE_INSF_ILi128ELi32EEELi128ESH_Li8EEESK_EENSN_ISW_SC_NSO_37RowMajorTensorOpMultiplicandCongruousILi16ELi64EEELi0ESY_Li16EEELSU_0ENS6_11threadblock9MmaPolicyINS6_4warp11MmaTensorOpINS7_ILi32ELi64ELi32EEESC_SQ_SC_S11_fNSO_8RowMajorENS15_17MmaTensorOpPolicyINSS_3MmaINS7_ILi16ELi8ELi16EEELi32ESC_S18_SC_NSO_11ColumnMajorEfS18_NSS_13OpMultiplyAddEEENSA_ILi1ELi1EEEEELi1ELb0EbEENSA_ILi0ELi0EEES1I_Li1EEELi6EbEENS_8epilogue11threadblock8EpilogueIS8_S1H_Li1ENS1M_22PredicatedTileIteratorINS1M_26OutputTileOptimalThreadMapINS1M_15OutputTileShapeILi128ELi8ELi2ELi1ELi1EEENS1Q_ILi1ELi4ELi1ELi1ELi4EEELi128ELi4ELi32EEEfLb0ENSO_9NoPermuteELb0EEENS1L_4warp24FragmentIteratorTensorOpIS17_S1B_fNS_5ArrayIfLi4ELb1EEES18_EENS1W_20TileIteratorTensorOpIS17_S1B_fS18_EENS1M_18SharedLoadIteratorINS1T_18CompactedThreadMapEfLi16EEENS1L_6thread17LinearCombinationIfLi4EffLNS26_9ScaleType4KindE0ELNS_15FloatRoundStyleE2EEENSA_ILi0ELi8EEELi2ELi1EEENS13_30GemmIdentityThreadblockSwizzleILi4EEELNS1_8OperatorE2ENS1_17Conv2dProblemSizeELNS1_9GroupModeE0EEEEEvNT_6ParamsE";

    /// A name that is cut, or that the demangler cannot read, is shown as far as it reads,
    /// never as its raw mangling.
    #[test]
    fn a_cut_or_unreadable_name_is_not_shown_raw() {
        let mut d = Demangler::default();
        assert_eq!(d.show(CUTLASS, 256), "cutlass__5x_cudnn::Kernel<…>");
        assert_eq!(d.failed, 1);
        for cut in [40, 100, 300, 1000] {
            assert_eq!(d.show(&CUTLASS[..cut], 256), "cutlass__5x_cudnn::Kernel<…>", "{cut}");
        }
        // Cut inside an identifier, inside a length, after the scope.
        assert_eq!(d.show("_ZN17cutlass__5x_cud", 256), "cutlass__5x_cud…");
        assert_eq!(d.show("_ZN5torch8autograd9generated1", 256), "torch::autograd::generated…");
        assert_eq!(d.show("_ZN5torch8autograd", 256), "torch::autograd…");
        assert_eq!(d.show("_ZNSt6vectorIiE9push_ba", 256), "std::vector<…>");
        assert_eq!(d.show("_ZN3FooC1ERKS_X", 256), "Foo::Foo(…)");
        // Nothing readable: a short prefix.
        let v0 = format!("_RNvC{}", "x".repeat(200));
        let shown = d.show(&v0, 256);
        assert!(shown.ends_with('…') && shown.len() <= SHORT + '…'.len_utf8(), "{shown}");
        assert_eq!(d.show("_Znot a symbol", 256), "_Znot a symbol");
        // Readable names are demangled in full.
        assert_eq!(d.show("_ZN3foo3barEv", 256), "foo::bar()");
        assert_eq!(d.show("cudaLaunchKernel", 256), "cudaLaunchKernel");
    }

    /// The budget counts bytes given to the demangler and names it failed on: past either, no
    /// name is given to it, and each is still shown readable.
    #[test]
    fn the_budget_is_respected() {
        let name = |i: usize| format!("_ZN3foo8bar{i:05}Ev");
        let len = name(0).len();
        let mut d = Demangler::with_budget(10 * len, 5);
        for i in 0..100 {
            // Past the budget, the readable prefix: the same name here.
            assert_eq!(d.show(&name(i), 256), format!("foo::bar{i:05}()"));
        }
        assert_eq!((d.attempts, d.attempted_bytes, d.not_tried), (10, 10 * len as u64, 90));
        // Failures: after 5, the rest are not tried, whatever budget is left.
        let bomb = |i: usize| format!("_Z1fI{}{i}E", "S_".repeat(1000));
        let mut d = Demangler::with_budget(usize::MAX, 5);
        for i in 0..1000 {
            assert_eq!(d.show(&bomb(i), 256), "f<…>");
        }
        assert_eq!((d.attempts, d.failed, d.not_tried), (5, 5, 995));
        // A name longer than MAX_NAME is never given to it.
        let mut d = Demangler::default();
        let long = format!("_ZN3foo{}{}Ev", 5000, "x".repeat(5000));
        let shown = d.show(&long, 64);
        assert!(shown.starts_with("foo::xxx") && shown.ends_with('…') && shown.len() <= 64 + 3, "{shown}");
        assert_eq!((d.attempts, d.not_tried), (0, 1));
    }
}
