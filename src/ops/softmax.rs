//! Numerically stable softmax.

/// In-place softmax over the whole slice. An all -inf row becomes all zeros.
pub fn softmax(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        x.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// log-softmax into a new vector.
pub fn log_softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = (x.iter().map(|&v| ((v - m) as f64).exp()).sum::<f64>()).ln() as f32 + m;
    x.iter().map(|&v| v - lse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_to_one() {
        let mut x = [1.0f32, 2.0, 3.0, f32::NEG_INFINITY];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[3], 0.0);
        let l = log_softmax(&[0.0, 0.0]);
        assert!((l[0] + std::f32::consts::LN_2).abs() < 1e-6);
    }
}
