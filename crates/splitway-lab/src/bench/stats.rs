//! Statistics for `splitway lab bench`: nearest-rank percentiles and medians
//! of per-round ratios (a ratio taken inside one round cancels the drift of
//! a machine whose cores are shared).

/// The nearest-rank percentile (`p` in 0..=100) of unsorted `values`;
/// `None` when empty. Nearest rank never invents a value that was not seen.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    // The epsilon keeps 99.9 % of 1,000 at rank 999: 0.999 × 1000 is
    // 999.000…1 in floating point.
    let rank = ((p.clamp(0.0, 100.0) / 100.0) * sorted.len() as f64 - 1e-9).ceil() as usize;
    Some(sorted[rank.saturating_sub(1).min(sorted.len() - 1)])
}

/// The median of `values` (the mean of the two middle values for an even
/// count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

/// The median over rounds of `value / reference` where both were measured
/// in the same round. Rounds missing either side, or with a zero reference,
/// are skipped.
pub fn median_of_ratios(pairs: &[(Option<f64>, Option<f64>)]) -> Option<f64> {
    let ratios: Vec<f64> = pairs
        .iter()
        .filter_map(|(value, reference)| match (value, reference) {
            (Some(v), Some(r)) if *r != 0.0 && r.is_finite() && v.is_finite() => Some(v / r),
            _ => None,
        })
        .collect();
    median(&ratios)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_nearest_rank() {
        let values: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), Some(500.0));
        assert_eq!(percentile(&values, 99.0), Some(990.0));
        assert_eq!(percentile(&values, 99.9), Some(999.0));
        assert_eq!(percentile(&values, 100.0), Some(1000.0));
        assert_eq!(percentile(&values, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
        // unsorted input, one sample
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[7.0], 99.9), Some(7.0));
    }

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN]), None);
    }

    #[test]
    fn median_of_ratios_pairs_rounds() {
        // Drift: the reference doubles between rounds, the ratio stays 0.5.
        let pairs = [
            (Some(5.0), Some(10.0)),
            (Some(10.0), Some(20.0)),
            (Some(20.0), Some(40.0)),
        ];
        assert_eq!(median_of_ratios(&pairs), Some(0.5));
        // Ratio of medians would differ from median of ratios here.
        let pairs = [
            (Some(1.0), Some(1.0)),
            (Some(3.0), Some(10.0)),
            (Some(9.0), Some(10.0)),
        ];
        assert_eq!(median_of_ratios(&pairs), Some(0.9));
        // Missing sides and zero references are skipped.
        let pairs = [
            (None, Some(1.0)),
            (Some(2.0), Some(0.0)),
            (Some(3.0), Some(4.0)),
        ];
        assert_eq!(median_of_ratios(&pairs), Some(0.75));
        assert_eq!(median_of_ratios(&[(None, None)]), None);
    }
}
