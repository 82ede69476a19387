//! KV cache and causal (optionally sliding-window, soft-capped) grouped-query attention.

use rayon::prelude::*;

use super::weight::dot;
use super::CpuTensor;
use crate::backend::{AttnParams, BackendError, KvShape, KvType, Result};

/// One layer's K and V for one sequence: `[positions, n_kv_heads * head_dim]` each, grown on
/// demand up to `shape.capacity` positions, or, for a ring (`shape.ring = Some(slots)`), up to
/// `slots` rows with position p in row `p % slots`.
#[derive(Debug, Clone)]
pub struct CpuKvCache {
    pub shape: KvShape,
    /// What a written row keeps of its values ([`KvType::round_row`] per position and head).
    pub kv_type: KvType,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Positions written (`lo .. len` are held).
    len: usize,
    /// Oldest position still held: 0 unless a ring has overwritten older ones.
    lo: usize,
}

impl CpuKvCache {
    pub fn new(shape: KvShape) -> Self {
        Self::with_type(shape, KvType::F32)
    }
    /// A cache whose rows are rounded as a `kv_type` cache stores them.
    pub fn with_type(shape: KvShape, kv_type: KvType) -> Self {
        CpuKvCache {
            shape,
            kv_type,
            k: Vec::new(),
            v: Vec::new(),
            len: 0,
            lo: 0,
        }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Oldest position still held (a ring drops positions more than its size behind the
    /// newest write).
    pub fn oldest(&self) -> usize {
        self.lo
    }
    fn width(&self) -> usize {
        self.shape.n_kv_heads * self.shape.head_dim
    }
    /// The row that holds position `p`.
    fn slot(&self, p: usize) -> usize {
        match self.shape.ring {
            Some(s) if s > 0 => p % s,
            _ => p,
        }
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
        if self.kv_type != KvType::F32 {
            let (mut k, mut v) = (k.clone(), v.clone());
            let hd = self.shape.head_dim;
            for row in k.data.chunks_mut(hd).chain(v.data.chunks_mut(hd)) {
                self.kv_type.round_row(row);
            }
            return self.write_rows(pos0, &k, &v);
        }
        self.write_rows(pos0, k, v)
    }

    fn write_rows(&mut self, pos0: usize, k: &CpuTensor, v: &CpuTensor) -> Result<()> {
        let w = self.width();
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
        let Some(slots) = self.shape.ring.filter(|&s| s > 0) else {
            if self.k.len() < end * w {
                self.k.resize(end * w, 0.0);
                self.v.resize(end * w, 0.0);
            }
            self.k[pos0 * w..end * w].copy_from_slice(&k.data);
            self.v[pos0 * w..end * w].copy_from_slice(&v.data);
            self.len = self.len.max(end);
            return Ok(());
        };
        let rows = end.min(slots);
        if self.k.len() < rows * w {
            self.k.resize(rows * w, 0.0);
            self.v.resize(rows * w, 0.0);
        }
        for (i, p) in (pos0..end).enumerate() {
            let r = self.slot(p);
            self.k[r * w..(r + 1) * w].copy_from_slice(&k.data[i * w..(i + 1) * w]);
            self.v[r * w..(r + 1) * w].copy_from_slice(&v.data[i * w..(i + 1) * w]);
        }
        // a rewrite that stops short of the old end may have overwritten positions past it
        self.len = if end < self.len && self.len - pos0 > slots {
            end
        } else {
            self.len.max(end)
        };
        self.lo = self.lo.max(end.saturating_sub(slots)).min(self.len);
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
        self.lo = self.lo.min(len);
        if self.shape.ring.is_none() {
            self.k.truncate(len * self.width());
            self.v.truncate(len * self.width());
        }
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
        let window_start = |pos: usize| match p.window {
            Some(win) if win > 0 => (pos + 1).saturating_sub(win),
            _ => 0,
        };
        if n > 0 && window_start(pos0) < self.lo {
            return Err(shape_err(format!(
                "position {pos0} attends from position {}, but the cache's ring of {:?} \
                 positions holds only {} onwards",
                window_start(pos0),
                self.shape.ring,
                self.lo
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
                let start = window_start(pos);
                let qv = &q.data[i * h * hd + head * hd..i * h * hd + (head + 1) * hd];
                scores.clear();
                for j in start..=pos {
                    let r = self.slot(j);
                    let kv = &self.k[r * w + kvh * hd..r * w + (kvh + 1) * hd];
                    let mut s = dot(qv, kv) * p.scale;
                    if let Some(cap) = p.softcap {
                        s = crate::ops::softcap(s, cap);
                    }
                    scores.push(s);
                }
                crate::ops::softmax(scores);
                o.iter_mut().for_each(|x| *x = 0.0);
                for (jj, &pj) in scores.iter().enumerate() {
                    let r = self.slot(start + jj);
                    let vv = &self.v[r * w + kvh * hd..r * w + (kvh + 1) * hd];
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
