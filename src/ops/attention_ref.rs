//! Reference attention against cached keys and values (already dequantised to f32), f64
//! accumulation: one query token ([`attention_decode`], the oracle of the `attn_decode`
//! kernels) or many query rows at given positions ([`attention_prefill`], the oracle of
//! `attn_prefill`).

/// Shape and options of one decode-attention call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeAttn {
    /// Query heads.
    pub hq: usize,
    /// Key/value heads; query head `h` reads KV head `h / (hq / hkv)`.
    pub hkv: usize,
    pub head_dim: usize,
    /// Multiplies q.k before the softcap.
    pub scale: f32,
    /// `cap * tanh(s / cap)` on the scores when > 0.
    pub softcap: f32,
    /// Attend only to the last `window` positions (the query's included) when > 0.
    pub window: usize,
}

/// Errors of the reference attention.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AttnRefError {
    #[error("bad shape: {0}")]
    Shape(String),
}

/// `q` [hq][d]; `k`, `v` [len][hkv][d]; returns [hq][d]. The query sits at position `len - 1`.
pub fn attention_decode(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    len: usize,
    p: &DecodeAttn,
) -> Result<Vec<f32>, AttnRefError> {
    let d = p.head_dim;
    if p.hkv == 0 || p.hq % p.hkv != 0 {
        return Err(AttnRefError::Shape(format!(
            "hq={} not a multiple of hkv={}",
            p.hq, p.hkv
        )));
    }
    if len == 0 || q.len() != p.hq * d || k.len() < len * p.hkv * d || v.len() < len * p.hkv * d {
        return Err(AttnRefError::Shape(format!(
            "q {} k {} v {} for len {len}",
            q.len(),
            k.len(),
            v.len()
        )));
    }
    let g = p.hq / p.hkv;
    let lo = if p.window > 0 {
        len.saturating_sub(p.window)
    } else {
        0
    };
    let mut out = vec![0f32; p.hq * d];
    for h in 0..p.hq {
        let kvh = h / g;
        let qh = &q[h * d..(h + 1) * d];
        let scores: Vec<f64> = (lo..len)
            .map(|j| {
                let kj = &k[(j * p.hkv + kvh) * d..(j * p.hkv + kvh + 1) * d];
                let s: f64 = qh
                    .iter()
                    .zip(kj)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    * p.scale as f64;
                if p.softcap > 0.0 {
                    p.softcap as f64 * (s / p.softcap as f64).tanh()
                } else {
                    s
                }
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let z: f64 = w.iter().sum();
        for e in 0..d {
            let acc: f64 = (lo..len)
                .zip(&w)
                .map(|(j, &wj)| wj * v[(j * p.hkv + kvh) * d + e] as f64)
                .sum();
            out[h * d + e] = (acc / z) as f32;
        }
    }
    Ok(out)
}

/// `q` [n][hq][d], row i at position `pos[i]`; `k`, `v` [len][hkv][d] with len > every pos.
/// Row i attends to the keys `0 ..= pos[i]` (the last `window` of them when `window` > 0).
/// Returns [n][hq][d].
pub fn attention_prefill(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pos: &[usize],
    p: &DecodeAttn,
) -> Result<Vec<f32>, AttnRefError> {
    let row = p.hq * p.head_dim;
    if q.len() != pos.len() * row {
        return Err(AttnRefError::Shape(format!(
            "q {} for {} rows of {row}",
            q.len(),
            pos.len()
        )));
    }
    let mut out = Vec::with_capacity(q.len());
    for (i, &pi) in pos.iter().enumerate() {
        out.extend(attention_decode(
            &q[i * row..(i + 1) * row],
            k,
            v,
            pi + 1,
            p,
        )?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_rows_are_causal_decodes() {
        let p = DecodeAttn {
            hq: 1,
            hkv: 1,
            head_dim: 1,
            scale: 1.0,
            softcap: 0.0,
            window: 0,
        };
        // equal keys: row at position j averages v[0..=j]
        let v = [3.0, 5.0, 10.0];
        let out = attention_prefill(&[1.0, 1.0, 1.0], &[0.0; 3], &v, &[0, 1, 2], &p).unwrap();
        assert_eq!(out, vec![3.0, 4.0, 6.0]);
        // out-of-order positions and a window of 1: each row sees only its own key
        let w = DecodeAttn { window: 1, ..p };
        let out = attention_prefill(&[1.0, 1.0], &[0.0; 3], &v, &[2, 0], &w).unwrap();
        assert_eq!(out, vec![10.0, 3.0]);
        assert!(attention_prefill(&[1.0], &[0.0; 3], &v, &[3], &p).is_err());
        assert!(attention_prefill(&[1.0, 1.0], &[0.0; 3], &v, &[0], &p).is_err());
    }

    #[test]
    fn single_key_returns_its_value() {
        let p = DecodeAttn {
            hq: 2,
            hkv: 1,
            head_dim: 2,
            scale: 1.0,
            softcap: 0.0,
            window: 0,
        };
        let out = attention_decode(&[1.0, 0.0, 0.0, 1.0], &[3.0, 4.0], &[5.0, 6.0], 1, &p).unwrap();
        assert_eq!(out, vec![5.0, 6.0, 5.0, 6.0]);
    }

    #[test]
    fn window_drops_old_keys_and_equal_scores_average() {
        let p = DecodeAttn {
            hq: 1,
            hkv: 1,
            head_dim: 1,
            scale: 1.0,
            softcap: 0.0,
            window: 2,
        };
        // keys all 0 -> equal weights; window 2 keeps positions 1 and 2 only
        let out = attention_decode(&[1.0], &[0.0; 3], &[100.0, 2.0, 4.0], 3, &p).unwrap();
        assert!((out[0] - 3.0).abs() < 1e-6);
        assert!(attention_decode(&[1.0], &[0.0; 3], &[0.0; 3], 0, &p).is_err());
    }

    #[test]
    fn softcap_bounds_scores() {
        let p = DecodeAttn {
            hq: 1,
            hkv: 1,
            head_dim: 1,
            scale: 1.0,
            softcap: 1.0,
            window: 0,
        };
        // scores 50 and 0 -> capped to ~1 and 0: weights e^1 : 1
        let out = attention_decode(&[50.0], &[1.0, 0.0], &[1.0, 0.0], 2, &p).unwrap();
        let e = std::f64::consts::E * (50f64).tanh().exp() / std::f64::consts::E;
        assert!((out[0] as f64 - e / (e + 1.0)).abs() < 1e-6);
    }
}
