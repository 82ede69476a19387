//! The read-bandwidth probe of the GEMV bench: the XOR of every sink word must equal the XOR of
//! the buffer (every 16-byte vector read exactly once).

use crate::backend::cuda::CudaError;
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::selftest::check::{time_us, CheckCtx, Comparison, KernelCheck, Measured};
use rand::RngCore;

pub struct ReadBwCheck;

impl KernelCheck for ReadBwCheck {
    fn name(&self) -> &'static str {
        "read_bw"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::ReadBw
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        0.0
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let mut buf = vec![0u8; (64 << 20) + 48]; // not a multiple of the grid stride
        cx.rng.fill_bytes(&mut buf);
        let want = buf.chunks_exact(4).fold(0u32, |a, c| {
            a ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]])
        });
        let grid = 264u32;
        let db = cx.dev.upload(&buf)?;
        let mut sink = cx.dev.upload(&vec![0xdead_beefu32; grid as usize * 256])?;
        cx.dev.read_bw(spec, &db, &mut sink, grid)?;
        let got = cx.dev.download(&sink)?.iter().fold(0u32, |a, &w| a ^ w);
        let cmp = Comparison {
            max_rel_err: if got == want { 0.0 } else { f64::INFINITY },
            unwritten: 0,
            elements: 1,
        };
        let dev = cx.dev;
        let micros = time_us(dev, cx.iters, || dev.read_bw(spec, &db, &mut sink, grid))?;
        Ok(Measured { cmp, micros })
    }
}
