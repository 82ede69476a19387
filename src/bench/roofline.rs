//! The read roofline of batch-1 decode: the bytes one token must read (every weight it touches,
//! plus the KV cache at its depth), against a bandwidth measured in the same run.
//!
//! Weights: every tensor in full, except the token embedding (one row; but read in full too when
//! it doubles as the LM head, i.e. there is no `output.weight`) and MoE expert banks
//! (`*_exps`: only the `expert_used_count` of `expert_count` experts a token is routed to).
//! KV: per attention layer, K and V (`kv_dim` = rows of `attn_k`; K=V layers without `attn_v`
//! still count both, since the cache stores both) for `min(depth, window)` positions.

use crate::gguf::GgufFile;

/// One attention layer's cache geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayer {
    /// K (or V) values per position: n_kv_heads * head_dim.
    pub kv_dim: usize,
    /// Sliding window in positions (None: global).
    pub window: Option<usize>,
}

/// What a decode token reads, from a GGUF's header.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeBytes {
    /// Weight bytes one token reads.
    pub weights: u64,
    /// All tensor bytes in the file (what a backend must hold resident).
    pub all_tensors: u64,
    pub layers: Vec<KvLayer>,
}

impl DecodeBytes {
    /// KV bytes read by a token at position `pos` (it attends to `pos + 1` positions).
    pub fn kv_bytes(&self, pos: usize, elem_bytes: f64) -> u64 {
        let n = pos + 1;
        self.layers
            .iter()
            .map(|l| {
                let len = l.window.map_or(n, |w| n.min(w));
                (2.0 * (l.kv_dim * len) as f64 * elem_bytes) as u64
            })
            .sum()
    }
    /// Bytes per token at position `pos`.
    pub fn per_token(&self, pos: usize, elem_bytes: f64) -> u64 {
        self.weights + self.kv_bytes(pos, elem_bytes)
    }
}

/// Count the decode bytes of the model in `g`.
pub fn decode_bytes(g: &GgufFile) -> DecodeBytes {
    let arch = g.architecture().unwrap_or("").to_string();
    let key = |k: &str| format!("{arch}.{k}");
    let n_exp = g.get_u64(&key("expert_count")).unwrap_or(0);
    let n_used = g.get_u64(&key("expert_used_count")).unwrap_or(0);
    let tied = g.tensor_info("output.weight").is_none();
    let mut weights = 0u64;
    let mut all = 0u64;
    for t in g.tensor_infos() {
        all += t.n_bytes;
        let rows: u64 = t.dims.iter().skip(1).product::<u64>().max(1);
        weights += if t.name == "token_embd.weight" {
            t.n_bytes / rows + if tied { t.n_bytes } else { 0 }
        } else if t.name.contains("_exps.") && n_exp > 0 {
            t.n_bytes / n_exp * n_used
        } else {
            t.n_bytes
        };
    }
    let window = g
        .get_u64(&key("attention.sliding_window"))
        .map(|w| w as usize);
    let pattern: Option<Vec<bool>> = g
        .get_array(&key("attention.sliding_window_pattern"))
        .and_then(|a| a.iter().map(|v| v.as_bool()).collect());
    let n_layer = g.get_u64(&key("block_count")).unwrap_or(0) as usize;
    let mut layers = Vec::new();
    for i in 0..n_layer {
        let Some(k) = g.tensor_info(&format!("blk.{i}.attn_k.weight")) else {
            continue; // no attention in this layer (recurrent)
        };
        let kv_dim = k.dims.get(1).copied().unwrap_or(0) as usize;
        let sliding = match (&pattern, arch.as_str()) {
            (Some(p), _) => p.get(i).copied().unwrap_or(false),
            (None, "gemma3") => (i + 1) % 6 != 0,
            _ => false,
        };
        layers.push(KvLayer {
            kv_dim,
            window: if sliding { window } else { None },
        });
    }
    DecodeBytes {
        weights,
        all_tensors: all,
        layers,
    }
}

/// Decode against the roofline.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Roofline {
    /// Bytes per token (weights + KV at the mean position of the timed window).
    pub bytes_per_token: u64,
    /// Measured read bandwidth, GB/s.
    pub bandwidth_gbs: f64,
    /// bandwidth / bytes per token.
    pub roofline_tok_s: f64,
    pub achieved_tok_s: f64,
    /// achieved bytes/s as a percentage of the bandwidth.
    pub percent: f64,
}

pub fn roofline(bytes_per_token: u64, bandwidth_gbs: f64, achieved_tok_s: f64) -> Roofline {
    let roof = bandwidth_gbs * 1e9 / bytes_per_token.max(1) as f64;
    Roofline {
        bytes_per_token,
        bandwidth_gbs,
        roofline_tok_s: roof,
        achieved_tok_s,
        percent: 100.0 * achieved_tok_s / roof,
    }
}
