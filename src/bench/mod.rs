//! The benchmarks behind `cuheap bench`: host threads on `cuheap-core`
//! ([`cpu`]), in-kernel allocation on the GPU ([`device`]), the device
//! heap's growth ([`growth`]) and the host pool
//! against CUDA's allocators ([`host`]), reported as
//! a table, JSON and an SVG chart ([`report`]). What each thread asks for
//! is in [`workload`], which the benchmark kernels compile too.

pub mod cpu;
pub mod device;
pub mod growth;
pub mod host;
pub mod replay;
pub mod report;
pub mod sampler;
pub mod snapshot;
pub mod spgemm;
pub mod workload;

/// One line per row with null allocations or errors (`counts` gives
/// them, `label` names the row): a benchmark that has any failed there,
/// whatever its times.
pub fn failed_rows<R>(
    rows: &[R],
    counts: impl Fn(&R) -> (u32, u32),
    label: impl Fn(&R) -> String,
) -> Vec<String> {
    rows.iter()
        .filter_map(|r| {
            let (nulls, errors) = counts(r);
            (nulls > 0 || errors > 0)
                .then(|| format!("{}: {nulls} nulls, {errors} errors", label(r)))
        })
        .collect()
}

/// Median of a non-empty sample (the mean of the middle two for even sizes).
pub fn median(xs: &mut [f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(super::median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(super::median(&mut []).is_nan());
    }
}
