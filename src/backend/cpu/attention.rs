//! KV cache and causal (optionally sliding-window, soft-capped) grouped-query attention.

use rayon::prelude::*;

use super::weight::dot;
use super::CpuTensor;
use crate::backend::{AttnParams, BackendError, KvShape, Result};

/// One layer's K and V for one sequence: `[positions, n_kv_heads * head_dim]` each, grown on
/// demand up to `shape.capacity` positions.
#[derive(Debug, Clone)]
pub struct CpuKvCache {
    pub shape: KvShape,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Positions written (all of `0..len` are valid).
    len: usize,
}

impl CpuKvCache {
    pub fn new(shape: KvShape) -> Self {
        CpuKvCache {
            shape,
            k: Vec::new(),
            v: Vec::new(),
            len: 0,
        }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    fn width(&self) -> usize {
        self.shape.n_kv_heads * self.shape.head_dim
    }

    pub fn write(&mut self, pos0: usize, k: &CpuTensor, v: &CpuTensor) -> Result<()> {
        let w = self.width();
        if k.cols != w || v.cols != w || k.rows != v.rows {
            return Err(BackendError::Shape {
                op: "kv_write",
                detail: format!(
                    "k [{}, {}], v [{}, {}], cache width {w}",
                    k.rows, k.cols, v.rows, v.cols
                ),
            });
        }
        let end = pos0 + k.rows;
        if end > self.shape.capacity {
            return Err(BackendError::KvOverflow {
                pos: end,
                capacity: self.shape.capacity,
            });
        }
        if pos0 > self.len {
            return Err(BackendError::Shape {
                op: "kv_write",
                detail: format!(
                    "write at {pos0} leaves a gap after {} cached positions",
                    self.len
                ),
            });
        }
        if self.k.len() < end * w {
            self.k.resize(end * w, 0.0);
            self.v.resize(end * w, 0.0);
        }
        self.k[pos0 * w..end * w].copy_from_slice(&k.data);
        self.v[pos0 * w..end * w].copy_from_slice(&v.data);
        self.len = self.len.max(end);
        Ok(())
    }

    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(BackendError::Shape {
                op: "kv_truncate",
                detail: format!("cannot extend {} cached positions to {len}", self.len),
            });
        }
        self.len = len;
        self.k.truncate(len * self.width());
        self.v.truncate(len * self.width());
        Ok(())
    }

    /// Causal attention of `q` (rows at positions `pos0 ..`) over the cached positions.
    pub fn attend(&self, q: &CpuTensor, pos0: usize, p: &AttnParams) -> Result<CpuTensor> {
        let (h, hkv, hd) = (p.n_heads, p.n_kv_heads, p.head_dim);
        let shape_err = |detail: String| BackendError::Shape {
            op: "attention",
            detail,
        };
        if hkv != self.shape.n_kv_heads || hd != self.shape.head_dim {
            return Err(shape_err(format!(
                "params {hkv} kv heads x {hd}, cache {} x {}",
                self.shape.n_kv_heads, self.shape.head_dim
            )));
        }
        if hkv == 0 || h % hkv != 0 || q.cols != h * hd {
            return Err(shape_err(format!(
                "q has {} columns for {h} heads x {hd} ({hkv} kv heads)",
                q.cols
            )));
        }
        let n = q.rows;
        if pos0 + n > self.len {
            return Err(shape_err(format!(
                "queries up to position {} but only {} positions cached",
                pos0 + n,
                self.len
            )));
        }
        let group = h / hkv;
        let w = self.width();
        let mut out = vec![0f32; n * h * hd];
        out.par_chunks_mut(hd).enumerate().for_each_init(
            || Vec::with_capacity(pos0 + n),
            |scores: &mut Vec<f32>, (idx, o)| {
                let (i, head) = (idx / h, idx % h);
                let kvh = head / group;
                let pos = pos0 + i;
                let start = match p.window {
                    Some(win) if win > 0 => (pos + 1).saturating_sub(win),
                    _ => 0,
                };
                let qv = &q.data[i * h * hd + head * hd..i * h * hd + (head + 1) * hd];
                scores.clear();
                for j in start..=pos {
                    let kv = &self.k[j * w + kvh * hd..j * w + (kvh + 1) * hd];
                    let mut s = dot(qv, kv) * p.scale;
                    if let Some(cap) = p.softcap {
                        s = crate::ops::softcap(s, cap);
                    }
                    scores.push(s);
                }
                crate::ops::softmax(scores);
                o.iter_mut().for_each(|x| *x = 0.0);
                for (jj, &pj) in scores.iter().enumerate() {
                    let j = start + jj;
                    let vv = &self.v[j * w + kvh * hd..j * w + (kvh + 1) * hd];
                    for (x, y) in o.iter_mut().zip(vv) {
                        *x += pj * y;
                    }
                }
            },
        );
        Ok(CpuTensor {
            rows: n,
            cols: h * hd,
            data: out,
        })
    }
}
