//! The DSL's float conversions (`kernel-templates/lib/convert.cuh.tera`) against `crate::quant`
//! and `half`: every e4m3 / e2m1 / f16 / bf16 code decoded, and random, boundary and exact-tie
//! values encoded. Exact: the bound is 0 (an encoded value is compared through its decoding).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::backend::cuda::CudaError;
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::quant::{bf16_to_f32, e2m1_to_f32, e4m3_to_f32, f16_to_f32, f32_to_e4m3};
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

pub struct ConvertCheck;

const E2M1_GRID: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// f32 -> e2m1: nearest grid value, ties to the even code, saturating at 6; NaN -> 7.
fn f32_to_e2m1(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 8 } else { 0 };
    if x.is_nan() {
        return sign | 7;
    }
    let a = x.abs();
    if a >= 6.0 {
        // saturating (satfinite), infinities included: every distance to the grid is inf there
        return sign | 7;
    }
    let mut best = 0usize;
    for (c, &g) in E2M1_GRID.iter().enumerate().skip(1) {
        let (d, bd) = ((g - a).abs(), (E2M1_GRID[best] - a).abs());
        if d < bd || (d == bd && c % 2 == 0) {
            best = c;
        }
    }
    sign | best as u8
}

fn inputs(cx: &mut CheckCtx<'_>) -> Vec<f32> {
    let mut x = uniform(&mut cx.rng, 4096, -600.0, 600.0);
    x.extend(uniform(&mut cx.rng, 4096, -8.0, 8.0));
    x.extend(uniform(&mut cx.rng, 4096, -0.03, 0.03));
    // exact ties between neighbouring e4m3 values, and between e2m1 grid values
    for c in 0u8..0x7e {
        let m = (e4m3_to_f32(c) + e4m3_to_f32(c + 1)) * 0.5;
        x.extend([m, -m]);
    }
    for w in E2M1_GRID.windows(2) {
        let m = (w[0] + w[1]) * 0.5;
        x.extend([m, -m]);
    }
    x.extend([
        0.0,
        -0.0,
        448.0,
        449.0,
        464.0,
        480.0,
        1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]);
    x.extend([
        1e-8,
        2f32.powi(-10),
        2f32.powi(-9),
        6.0,
        7.0,
        65504.0,
        65520.0,
        1e-7,
        3.0e38,
    ]);
    x
}

fn launch(
    dev: &crate::backend::cuda::CudaDevice,
    spec: &'static KernelSpec,
    x: &CudaSlice<f32>,
    dec: &mut CudaSlice<f32>,
    enc: &mut CudaSlice<u32>,
) -> Result<(), CudaError> {
    let f = dev.function(spec)?;
    let n = x.len() as i32;
    let cfg = LaunchConfig {
        grid_dim: (128, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    if dec.len() < 272 + 2 * 65536 || enc.len() < 2 * x.len() {
        return Err(CudaError::Invalid {
            op: "convert",
            detail: "output buffers too small".into(),
        });
    }
    let mut b = dev.stream().launch_builder(&f);
    b.arg(x).arg(dec).arg(enc).arg(&n);
    // SAFETY: matches (const float* x, float* dec, uint32_t* enc, int n): x holds n floats,
    // dec at least 272 + 2*65536 floats and enc 2n words (checked above).
    unsafe { b.launch(cfg) }
        .map(|_| ())
        .map_err(|source| CudaError::Driver {
            context: format!("launching {}", spec.name),
            source,
        })
}

impl KernelCheck for ConvertCheck {
    fn name(&self) -> &'static str {
        "convert"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::Convert
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        0.0
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let x = inputs(cx);
        let n = x.len();
        let dev = cx.dev;
        let dx = dev.upload(&x)?;
        let mut dec = dev.filled_f32(272 + 2 * 65536, f32::NAN)?;
        let mut enc = dev.upload(&vec![u32::MAX; 2 * n])?;
        launch(cx.dev, spec, &dx, &mut dec, &mut enc)?;
        let got_dec = dev.download(&dec)?;
        let got_enc = dev.download(&enc)?;

        let mut want: Vec<f32> = (0..=255u8).map(e4m3_to_f32).collect();
        want.extend((0..16u8).map(e2m1_to_f32));
        want.extend((0..=u16::MAX).map(f16_to_f32));
        want.extend((0..=u16::MAX).map(bf16_to_f32));
        let mut got = got_dec;
        // Encodings, compared through their decodings.
        for (i, &v) in x.iter().enumerate() {
            let (lo, hi) = (got_enc[2 * i], got_enc[2 * i + 1]);
            got.push(e4m3_to_f32((lo & 0xff) as u8));
            got.push(e2m1_to_f32(((lo >> 8) & 0xf) as u8));
            got.push(bf16_to_f32((hi & 0xffff) as u16));
            got.push(f16_to_f32((hi >> 16) as u16));
            want.push(e4m3_to_f32(f32_to_e4m3(v)));
            want.push(e2m1_to_f32(f32_to_e2m1(v)));
            want.push(half::bf16::from_f32(v).to_f32());
            want.push(half::f16::from_f32(v).to_f32());
        }
        let mut cmp = Comparison::new(&got, &want);
        // An untouched enc word (still all ones) is an unwritten output.
        cmp.unwritten += got_enc.iter().filter(|&&w| w == u32::MAX).count();
        let micros = time_us(dev, cx.iters, || launch(dev, spec, &dx, &mut dec, &mut enc))?;
        Ok(Measured { cmp, micros })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2m1_reference_rounds_to_nearest_even() {
        for (c, &v) in E2M1_GRID.iter().enumerate() {
            assert_eq!(f32_to_e2m1(v), c as u8);
            assert_eq!(f32_to_e2m1(-v), if v == 0.0 { 8 } else { 8 | c as u8 });
        }
        let ties = [
            (0.25, 0),
            (0.75, 2),
            (1.25, 2),
            (1.75, 4),
            (2.5, 4),
            (3.5, 6),
            (5.0, 6),
        ];
        for (v, c) in ties {
            assert_eq!(f32_to_e2m1(v), c, "{v}");
        }
        assert_eq!(f32_to_e2m1(100.0), 7);
        assert_eq!(f32_to_e2m1(f32::INFINITY), 7);
        assert_eq!(f32_to_e2m1(f32::NEG_INFINITY), 15);
        assert_eq!(f32_to_e2m1(0.3), 1);
        assert_eq!(e2m1_to_f32(f32_to_e2m1(-2.9)), -3.0);
    }
}
