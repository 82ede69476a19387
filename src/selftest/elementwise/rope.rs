//! RoPE instances vs `crate::ops::rope`: NEOX full rotary at large positions (theta 1e6),
//! interleaved partial rotary, Gemma-4-style p-RoPE (head_dim 512, 128 rotated dims, exponent
//! over head_dim, freq factors), Qwen3.5-style 25% partial rotary with theta 1e7; positions come
//! from device memory.

use crate::backend::cuda::{CudaError, RopeLaunch};
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops::{rope, RopeLayout, RopeSpec};
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};
use rand::Rng;

pub struct RopeCheck;

impl KernelCheck for RopeCheck {
    fn name(&self) -> &'static str {
        "rope"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::Rope
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        2e-5
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        // (rows, n_heads, head_dim, rot_dims, freq_base_dims, layout, theta, freq factors)
        let cases = [
            (
                5usize,
                8usize,
                128usize,
                128usize,
                128usize,
                RopeLayout::Neox,
                1.0e6f32,
                false,
            ),
            (4, 4, 128, 64, 64, RopeLayout::Interleaved, 1.0e4, false),
            (3, 2, 512, 128, 512, RopeLayout::Neox, 1.0e6, true),
            (4, 4, 256, 64, 64, RopeLayout::Neox, 1.0e7, false),
        ];
        let mut cmp = Comparison::default();
        for &(rows, n_heads, head_dim, rot_dims, fbd, layout, theta, with_ff) in &cases {
            let row = n_heads * head_dim;
            let x = uniform(&mut cx.rng, rows * row, -2.0, 2.0);
            let pos: Vec<i32> = (0..rows).map(|_| cx.rng.random_range(0..131_072)).collect();
            let ff: Option<Vec<f32>> =
                with_ff.then(|| uniform(&mut cx.rng, rot_dims / 2, 1.0, 8.0));
            let rs = RopeSpec {
                head_dim,
                rot_dims,
                theta,
                layout,
                freq_factors: ff.as_deref(),
                freq_base_dims: fbd,
            };
            let mut want = x.clone();
            for (r, chunk) in want.chunks_exact_mut(row).enumerate() {
                rope(chunk, n_heads, pos[r] as usize, &rs);
            }
            let dx = cx.dev.upload(&x)?;
            let dpos = cx.dev.upload(&pos)?;
            let dff = match &ff {
                Some(v) => Some(cx.dev.upload(v)?),
                None => None,
            };
            let mut out = cx.dev.filled_f32(x.len(), f32::NAN)?;
            let p = RopeLaunch {
                rows,
                n_heads,
                head_dim,
                rot_dims,
                freq_base_dims: fbd,
                layout,
                theta,
            };
            cx.dev.rope(spec, &dx, &mut out, &dpos, dff.as_ref(), &p)?;
            cmp = cmp.merge(Comparison::new(&cx.dev.download(&out)?, &want));
        }
        // Timing: a decode batch of 32 tokens, 16 heads x 256.
        let p = RopeLaunch {
            rows: 32,
            n_heads: 16,
            head_dim: 256,
            rot_dims: 256,
            freq_base_dims: 256,
            layout: RopeLayout::Neox,
            theta: 1.0e4,
        };
        let n = p.rows * p.n_heads * p.head_dim;
        let dx = cx.dev.upload(&uniform(&mut cx.rng, n, -2.0, 2.0))?;
        let dpos = cx
            .dev
            .upload(&(0..p.rows as i32).map(|i| 1000 + i).collect::<Vec<i32>>())?;
        let mut out = cx.dev.filled_f32(n, f32::NAN)?;
        let dev = cx.dev;
        let micros = time_us(dev, cx.iters, || {
            dev.rope(spec, &dx, &mut out, &dpos, None, &p)
        })?;
        Ok(Measured { cmp, micros })
    }
}
