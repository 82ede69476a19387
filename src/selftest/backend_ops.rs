//! Backend-level GPU check: every `CudaBackend` op the models use against `CpuBackend` on random
//! inputs, one row per (op, case), printed after the kernel table by `fucina selftest`.
//!
//! Bounds (same metric as the kernel table, `Comparison`):
//! - copies (slice, concat, split_heads, weight_vector) and embed: exact (0; embedding tables
//!   stay BF16 at upload);
//! - add / mul / scale: exact (single f32 roundings, same as the CPU);
//! - sigmoid gate, soft-cap, GLU, norms, RoPE: 1e-4 (libm vs CUDA transcendental ulps; f32 vs
//!   f64 sums and angles);
//! - linear, n <= 8 (GEMV), block formats vs `CpuBackend::int8()` (same int8 activations): 1e-3;
//!   float formats vs `CpuBackend::new()`: 1e-4;
//! - linear, n > 8, GEMM formats (bf16 activations, weights as bf16: `gemm_pipe`, block formats
//!   dequantised chunk by chunk, the chunked rows with a 1 MiB scratch) vs the f32 reference:
//!   3e-2 (bf16 rounding of both operands, ~2^-9 per product; an indexing bug gives O(1));
//!   F16 (`gemm_pipe` f16: f16 activations scaled per row, 11 significant bits): 2e-3;
//!   F32 (`gemm_f32`, f32 on CUDA cores): 1e-4;
//! - linear of a Q5_K weight (no kernels: stored as F16 at upload) vs the f32 reference: 4e-3;
//! - Q4_0 weights with rows of whole 256-value groups run repacked (`q4_0r`, at upload), the
//!   1056-column Q4_0 rows in the GGUF layout;
//! - moe at prefill sizes (n = 64..512: the grouped tensor-core GEMMs, bf16 activations and
//!   weights, against the f32 CPU backend): [`MOE_BOUND`].

use crate::backend::{Fused, Ops, Runtime};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, CudaDevice, GpuTensor, KvType};
use crate::backend::{step_at, Activation, LogitRows, Norm, Rope, StepPlan};
use crate::kernels::Quant;
use crate::ops::qdot::random_weights;
use crate::ops::RopeLayout;
use crate::quant::GgmlType;
use crate::selftest::check::{uniform, Comparison};
use crate::selftest::moe::pipeline::{cpu_moe, make_case_with, CaseSpec};
use crate::weights::{Scales, TensorFormat, TensorRef};

/// One row of the backend table.
#[derive(Debug, Clone)]
pub struct OpRow {
    pub name: String,
    pub max_rel_err: Option<f64>,
    pub bound: f64,
    pub pass: bool,
    pub note: String,
}

pub(in crate::selftest) type Pair = (Vec<f32>, Vec<f32>);
pub(in crate::selftest) type R<T> = anyhow::Result<T>;

pub(in crate::selftest) struct Ctx {
    pub(in crate::selftest) gpu: CudaBackend,
    pub(in crate::selftest) cpu: CpuBackend,
    pub(in crate::selftest) cpu8: CpuBackend,
    pub(in crate::selftest) rng: StdRng,
    rows: Vec<OpRow>,
}

impl Ctx {
    pub(in crate::selftest) fn case(
        &mut self,
        name: String,
        bound: f64,
        f: impl FnOnce(&mut Ctx) -> R<Pair>,
    ) {
        let row = match f(self) {
            Ok((got, want)) => {
                let c = Comparison::new(&got, &want);
                OpRow {
                    name,
                    max_rel_err: Some(c.max_rel_err),
                    bound,
                    pass: c.passes(bound),
                    note: if c.unwritten > 0 {
                        format!("{} outputs NaN", c.unwritten)
                    } else {
                        String::new()
                    },
                }
            }
            Err(e) => OpRow {
                name,
                max_rel_err: None,
                bound,
                pass: false,
                note: format!("error: {e}"),
            },
        };
        self.rows.push(row);
    }

    pub(in crate::selftest) fn t2(
        &self,
        data: &[f32],
        rows: usize,
        cols: usize,
    ) -> R<(GpuTensor, crate::backend::cpu::CpuTensor)> {
        Ok((
            self.gpu.tensor(data, rows, cols)?,
            self.cpu.tensor(data, rows, cols)?,
        ))
    }
}

pub(in crate::selftest) fn host(gpu: &CudaBackend, t: &GpuTensor) -> R<Vec<f32>> {
    Ok(gpu.to_host(t)?)
}

/// Run every backend op check on `dev`.
pub fn run(dev: std::sync::Arc<CudaDevice>, seed: u64) -> R<Vec<OpRow>> {
    let gpu = CudaBackend::with_device(dev, KvType::Fp8E4m3)?;
    let mut cx = Ctx {
        gpu,
        cpu: CpuBackend::new(),
        cpu8: CpuBackend::int8(),
        rng: StdRng::seed_from_u64(seed),
        rows: Vec::new(),
    };
    linear_cases(&mut cx);
    linear_pipe_cases(&mut cx);
    embed_cases(&mut cx);
    elementwise_cases(&mut cx);
    shape_cases(&mut cx);
    norm_rope_cases(&mut cx);
    moe_cases(&mut cx);
    crate::selftest::backend_fused::side_car_cases(&mut cx);
    crate::selftest::linear::backend_glu::linear_glu_cases(&mut cx);
    crate::selftest::attention::backend_qkv_prep::qkv_prep_cases(&mut cx);
    crate::selftest::linear::backend_res::linear_res_cases(&mut cx);
    crate::selftest::linear::backend_res::rsqv_cases(&mut cx);
    crate::selftest::linear::backend_res_wide::wide_cases(&mut cx);
    crate::selftest::linear::backend_glurs::glurs_cases(&mut cx);
    crate::selftest::attention::backend_qkv::qkv_cases(&mut cx);
    crate::selftest::backend_fused::add_rms_norm_cases(&mut cx);
    crate::selftest::backend_fused::norm_add_rms_norm_cases(&mut cx);
    crate::selftest::backend_fused::attn_prep_cases(&mut cx);
    crate::selftest::attention::backend_attend::attend_cases(&mut cx);
    crate::selftest::attention::backend_kv::kv_recycle_cases(&mut cx);
    crate::selftest::attention::backend_arena::arena_cases(&mut cx);
    crate::selftest::linear::backend_prefill::prefill_cases(&mut cx);
    crate::selftest::moe::backend_moe::moe_fused_cases(&mut cx);
    Ok(cx.rows)
}

pub(in crate::selftest) fn tref<'a>(
    name: &str,
    ty: GgmlType,
    shape: Vec<usize>,
    data: &'a [u8],
) -> TensorRef<'a> {
    TensorRef {
        name: name.to_string(),
        shape,
        format: TensorFormat::Ggml(ty),
        data,
        scales: Scales::default(),
    }
}

/// Random weights of `ty`; Q5_K (no generator in `ops::qdot`) as random blocks with small
/// positive super-scales.
fn weights_of(ty: GgmlType, rows: usize, k: usize, rng: &mut StdRng) -> R<Vec<u8>> {
    if ty != GgmlType::Q5K {
        return Ok(random_weights(ty, rows, k, rng)?);
    }
    let rb = ty.row_bytes(k)?;
    let mut w = vec![0u8; rows * rb];
    rng.fill(&mut w[..]);
    for b in w.chunks_exact_mut(176) {
        let d = half::f16::from_f32(rng.random_range(1e-4..1e-3)).to_bits();
        let m = half::f16::from_f32(rng.random_range(1e-4..1e-3)).to_bits();
        b[0..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&m.to_le_bytes());
    }
    Ok(w)
}

const LINEAR_TYPES: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    // no kernels: stored as F16 at upload
    GgmlType::Q5K,
];

fn linear_cases(cx: &mut Ctx) {
    // Q4_0 twice: rows of 1024 are repacked at upload (q4_0r), rows of 1056 keep the GGUF layout
    let shapes = LINEAR_TYPES
        .into_iter()
        .map(|ty| (ty, 512usize, 1024usize))
        .chain([(GgmlType::Q4_0, 512, 1056)]);
    for (ty, out, k) in shapes {
        let w = match weights_of(ty, out, k, &mut cx.rng) {
            Ok(w) => w,
            Err(e) => {
                cx.case(format!("linear {} (weights)", ty.name()), 0.0, |_| {
                    Err(anyhow::anyhow!("{e}"))
                });
                continue;
            }
        };
        let r = tref("w", ty, vec![out, k], &w);
        let (gw, cw) = match (cx.gpu.upload(&r), cx.cpu.upload(&r)) {
            (Ok(g), Ok(c)) => (g, c),
            (g, c) => {
                let e = format!("{:?} / {:?}", g.err(), c.err());
                cx.case(format!("linear {} (upload)", ty.name()), 0.0, |_| {
                    Err(anyhow::anyhow!(e))
                });
                continue;
            }
        };
        let block = ty.block().0 > 1;
        let stored_f16 = ty == GgmlType::Q5K;
        for n in [1usize, 3, 8, 17, 64] {
            let gemm = n > 8 && ty != GgmlType::F32 && !stored_f16;
            let int8 = n <= 8 && block && !stored_f16;
            let bound = if gemm && ty == GgmlType::F16 {
                // f16 activations (11 significant bits, a scale per row)
                2e-3
            } else if gemm {
                3e-2
            } else if int8 {
                1e-3
            } else if stored_f16 {
                // f16 rounding of the dequantised weights (2^-11 each, ~3e-4 rms on the output)
                4e-3
            } else {
                1e-4
            };
            let x = uniform(&mut cx.rng, n * k, -1.0, 1.0);
            cx.case(
                format!("linear {} n={n} ({out}x{k})", ty.name()),
                bound,
                |cx| {
                    let (gx, cxt) = cx.t2(&x, n, k)?;
                    let got = host(&cx.gpu, &cx.gpu.linear(&gx, &gw)?)?;
                    let refb = if int8 { &cx.cpu8 } else { &cx.cpu };
                    let want = refb.linear(&cxt, &cw)?.data;
                    Ok((got, want))
                },
            );
        }
    }
}

/// `linear` through `gemm_pipe` with a 1 MiB weight scratch: 1000 outputs of 1024 inputs run
/// as two chunks of 512 rows (the second partial), 300 rows of x (a partial M tile); then
/// `linear` itself on a 512 x 4096 x 512 product (the wgmma tile's shape on sm_90a).
fn linear_pipe_cases(cx: &mut Ctx) {
    for ty in [
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ] {
        pipe_case(cx, ty, (1000, 1024, 300), Some(1 << 20));
    }
    // a prompt-sized product (512 rows x 4096 outputs, one chunk): the shape where the tile
    // model picks the 128 x 128 wgmma entry on sm_90a (mma.sync tiles elsewhere)
    for ty in [GgmlType::Q4_0, GgmlType::Q4K] {
        pipe_case(cx, ty, (4096, 512, 512), None);
    }
}

/// `x [n, k] . w [out, k]^T` on the GPU against the CPU: through `linear_gemm_pipe` with
/// `scratch` bytes of weight scratch, or through `linear` itself (None).
fn pipe_case(
    cx: &mut Ctx,
    ty: GgmlType,
    (out, k, n): (usize, usize, usize),
    scratch: Option<usize>,
) {
    let name = match scratch {
        Some(_) => format!("linear {} n={n} ({out}x{k}) gemm_pipe, 2 chunks", ty.name()),
        None => format!(
            "linear {} n={n} ({out}x{k}) gemm_pipe, one chunk",
            ty.name()
        ),
    };
    let x = uniform(&mut cx.rng, n * k, -1.0, 1.0);
    let w = random_weights(ty, out, k, &mut cx.rng);
    cx.case(name, 3e-2, |cx| {
        let w = w?;
        let r = tref("w", ty, vec![out, k], &w);
        let (gw, cw) = (cx.gpu.upload(&r)?, cx.cpu.upload(&r)?);
        let (gx, cxt) = cx.t2(&x, n, k)?;
        let got = match scratch {
            Some(cap) => host(&cx.gpu, &cx.gpu.linear_gemm_pipe(&gx, &gw, cap)?)?,
            None => host(&cx.gpu, &cx.gpu.linear(&gx, &gw)?)?,
        };
        let want = cx.cpu.linear(&cxt, &cw)?.data;
        Ok((got, want))
    });
}

fn embed_cases(cx: &mut Ctx) {
    let (vocab, d) = (300usize, 512usize);
    for ty in &LINEAR_TYPES[..8] {
        let ty = *ty;
        let Ok(w) = random_weights(ty, vocab, d, &mut cx.rng) else {
            continue;
        };
        let r = tref("token_embd.weight", ty, vec![vocab, d], &w);
        let ids = [0u32, 7, 299, 7, 123];
        cx.case(format!("embed {}", ty.name()), 0.0, |cx| {
            let (gw, cw) = (cx.gpu.upload(&r)?, cx.cpu.upload(&r)?);
            let plan = StepPlan::single(&ids, 11, LogitRows::All)?;
            let (gs, cs) = (cx.gpu.step(plan.clone())?, cx.cpu.step(plan)?);
            let got = host(&cx.gpu, &cx.gpu.embed(&gw, &gs, 3.5)?)?;
            Ok((got, cx.cpu.embed(&cw, &cs, 3.5)?.data))
        });
    }
}

fn elementwise_cases(cx: &mut Ctx) {
    let (n, c) = (5usize, 2560usize);
    let a = uniform(&mut cx.rng, n * c, -40.0, 40.0);
    let b = uniform(&mut cx.rng, n * c, -6.0, 6.0);
    let brow = uniform(&mut cx.rng, c, -2.0, 2.0);
    let bcol = uniform(&mut cx.rng, n, -6.0, 6.0);
    type Op2 = fn(&Ctx, &[f32], &[f32], (usize, usize), (usize, usize)) -> R<Pair>;
    let binary: [(&str, f64, Op2, bool); 6] = [
        (
            "add",
            0.0,
            |cx, a, b, sa, sb| bin(cx, a, b, sa, sb, 0),
            false,
        ),
        (
            "mul",
            0.0,
            |cx, a, b, sa, sb| bin(cx, a, b, sa, sb, 1),
            false,
        ),
        (
            "mul [1,cols]",
            0.0,
            |cx, a, b, sa, sb| bin(cx, a, b, sa, sb, 1),
            true,
        ),
        (
            "sigmoid_gate",
            1e-4,
            |cx, a, b, sa, sb| bin(cx, a, b, sa, sb, 2),
            false,
        ),
        (
            "sigmoid_gate [n,1]",
            1e-4,
            |cx, a, b, sa, sb| bin(cx, a, b, sa, sb, 2),
            true,
        ),
        (
            "glu silu",
            1e-4,
            |cx, a, b, sa, sb| bin(cx, a, b, sa, sb, 3),
            false,
        ),
    ];
    for (name, bound, f, bcast) in binary {
        let (bb, sb) = match (bcast, name.starts_with("mul")) {
            (false, _) => (&b, (n, c)),
            (true, true) => (&brow, (1, c)),
            (true, false) => (&bcol, (n, 1)),
        };
        cx.case(name.to_string(), bound, |cx| f(cx, &a, bb, (n, c), sb));
    }
    cx.case("glu gelu_tanh".into(), 1e-4, |cx| {
        bin(cx, &a, &b, (n, c), (n, c), 4)
    });
    for (label, act) in [
        ("silu", Activation::Silu),
        ("gelu_tanh", Activation::GeluTanh),
    ] {
        cx.case(format!("glu_fused {label} (gate|up halves)"), 1e-4, |cx| {
            let (g, h) = cx.t2(&a, n, c)?;
            Ok((
                host(&cx.gpu, &cx.gpu.glu_fused(&g, act)?)?,
                cx.cpu.glu_fused(&h, act)?.data,
            ))
        });
    }
    cx.case("scale".into(), 0.0, |cx| {
        let (g, h) = cx.t2(&a, n, c)?;
        Ok((
            host(&cx.gpu, &cx.gpu.scale(&g, 0.125)?)?,
            cx.cpu.scale(&h, 0.125)?.data,
        ))
    });
    cx.case("softcap".into(), 1e-4, |cx| {
        let (g, h) = cx.t2(&a, n, c)?;
        Ok((
            host(&cx.gpu, &cx.gpu.softcap(&g, 30.0)?)?,
            cx.cpu.softcap(&h, 30.0)?.data,
        ))
    });
}

/// Binary op `which` (0 add, 1 mul, 2 sigmoid_gate, 3 glu silu, 4 glu gelu) on both backends.
fn bin(
    cx: &Ctx,
    a: &[f32],
    b: &[f32],
    sa: (usize, usize),
    sb: (usize, usize),
    which: u8,
) -> R<Pair> {
    let (ga, ca) = cx.t2(a, sa.0, sa.1)?;
    let (gb, cb) = cx.t2(b, sb.0, sb.1)?;
    let (g, c) = match which {
        0 => (cx.gpu.add(&ga, &gb)?, cx.cpu.add(&ca, &cb)?),
        1 => (cx.gpu.mul(&ga, &gb)?, cx.cpu.mul(&ca, &cb)?),
        2 => (
            cx.gpu.sigmoid_gate(&ga, &gb)?,
            cx.cpu.sigmoid_gate(&ca, &cb)?,
        ),
        3 => (
            cx.gpu.glu(&ga, &gb, Activation::Silu)?,
            cx.cpu.glu(&ca, &cb, Activation::Silu)?,
        ),
        _ => (
            cx.gpu.glu(&ga, &gb, Activation::GeluTanh)?,
            cx.cpu.glu(&ca, &cb, Activation::GeluTanh)?,
        ),
    };
    Ok((host(&cx.gpu, &g)?, c.data))
}

fn shape_cases(cx: &mut Ctx) {
    let (n, c) = (6usize, 3 * 160usize);
    let x = uniform(&mut cx.rng, n * c, -3.0, 3.0);
    let y = uniform(&mut cx.rng, n * 96, -3.0, 3.0);
    cx.case("slice_cols".into(), 0.0, |cx| {
        let (g, h) = cx.t2(&x, n, c)?;
        Ok((
            host(&cx.gpu, &cx.gpu.slice_cols(&g, 37, 200)?)?,
            cx.cpu.slice_cols(&h, 37, 200)?.data,
        ))
    });
    // one row: a view into the input (no copy); then an op reading the view, and a view of a view
    cx.case("slice_cols one row (view) -> rms_norm".into(), 1e-5, |cx| {
        let (g, h) = cx.t2(&x[..c], 1, c)?;
        let (gv, hv) = (
            cx.gpu.slice_cols(&g, 37, 256)?,
            cx.cpu.slice_cols(&h, 37, 256)?,
        );
        let (gvv, hvv) = (
            cx.gpu.slice_cols(&gv, 128, 128)?,
            cx.cpu.slice_cols(&hv, 128, 128)?,
        );
        let mut got = host(&cx.gpu, &gv)?;
        let mut want = hv.data.clone();
        got.extend(host(
            &cx.gpu,
            &cx.gpu.rms_norm(&gvv, Norm::None, 1e-6, 64)?,
        )?);
        want.extend(cx.cpu.rms_norm(&hvv, Norm::None, 1e-6, 64)?.data);
        Ok((got, want))
    });
    cx.case("slice_rows".into(), 0.0, |cx| {
        let (g, h) = cx.t2(&x, n, c)?;
        Ok((
            host(&cx.gpu, &cx.gpu.slice_rows(&g, n - 1, 1)?)?,
            cx.cpu.slice_rows(&h, n - 1, 1)?.data,
        ))
    });
    cx.case("concat_cols".into(), 0.0, |cx| {
        let (g1, h1) = cx.t2(&x, n, c)?;
        let (g2, h2) = cx.t2(&y, n, 96)?;
        Ok((
            host(&cx.gpu, &cx.gpu.concat_cols(&[&g2, &g1, &g2])?)?,
            cx.cpu.concat_cols(&[&h2, &h1, &h2])?.data,
        ))
    });
    cx.case("concat_rows".into(), 0.0, |cx| {
        let (g1, h1) = cx.t2(&x, n, c)?;
        let (g2, h2) = cx.t2(&x[..c], 1, c)?;
        Ok((
            host(&cx.gpu, &cx.gpu.concat_rows(&[&g2, &g1, &g2])?)?,
            cx.cpu.concat_rows(&[&h2, &h1, &h2])?.data,
        ))
    });
    cx.case("split_heads 3 x [128, 32]".into(), 0.0, |cx| {
        let (g, h) = cx.t2(&x, n, c)?;
        let gs = cx.gpu.split_heads(&g, 3, &[128, 32])?;
        let hs = cx.cpu.split_heads(&h, 3, &[128, 32])?;
        let mut got = Vec::new();
        for t in &gs {
            got.extend(host(&cx.gpu, t)?);
        }
        Ok((got, hs.into_iter().flat_map(|t| t.data).collect()))
    });
    cx.case("weight_vector (1-D f32)".into(), 0.0, |cx| {
        let v = uniform(&mut cx.rng, 300, -1.0, 1.0);
        let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
        let r = tref("norm", GgmlType::F32, vec![300], &bytes);
        let (gw, cw) = (cx.gpu.upload(&r)?, cx.cpu.upload(&r)?);
        Ok((
            host(&cx.gpu, &cx.gpu.weight_vector(&gw)?)?,
            cx.cpu.weight_vector(&cw)?.data,
        ))
    });
}

fn norm_rope_cases(cx: &mut Ctx) {
    let (n, heads, hd) = (5usize, 4usize, 128usize);
    let x = uniform(&mut cx.rng, n * heads * hd, -3.0, 3.0);
    let wv = uniform(&mut cx.rng, heads * hd, -1.0, 1.0);
    let wh = uniform(&mut cx.rng, hd, -1.0, 1.0);
    for (name, per_head, mode) in [
        ("rms_norm plain row", false, 0),
        ("rms_norm 1+w head", true, 1),
        ("rms_norm none head", true, 2),
    ] {
        cx.case(name.into(), 1e-4, |cx| {
            let (g, h) = cx.t2(&x, n, heads * hd)?;
            let w = if per_head { &wh } else { &wv };
            let (gw, cw) = cx.t2(w, 1, w.len())?;
            let dim = if per_head { hd } else { heads * hd };
            let (gn, cn) = match mode {
                0 => (Norm::Plain(&gw), Norm::Plain(&cw)),
                1 => (Norm::OnePlus(&gw), Norm::OnePlus(&cw)),
                _ => (Norm::None, Norm::None),
            };
            Ok((
                host(&cx.gpu, &cx.gpu.rms_norm(&g, gn, 1e-6, dim)?)?,
                cx.cpu.rms_norm(&h, cn, 1e-6, dim)?.data,
            ))
        });
    }
    cx.case("l2_norm head".into(), 1e-4, |cx| {
        let (g, h) = cx.t2(&x, n, heads * hd)?;
        Ok((
            host(&cx.gpu, &cx.gpu.l2_norm(&g, 1e-6, hd)?)?,
            cx.cpu.l2_norm(&h, 1e-6, hd)?.data,
        ))
    });
    let ff: Vec<f32> = (0..32).map(|i| 1.0 + (i % 5) as f32).collect();
    for (layout, rot, factors, pos0) in [
        (RopeLayout::Neox, hd, false, 37usize),
        (RopeLayout::Neox, hd / 2, true, 37),
        (RopeLayout::Interleaved, hd, false, 1000),
        (RopeLayout::Interleaved, hd / 4, true, 5),
    ] {
        let rope = Rope {
            head_dim: hd,
            rot_dims: rot,
            theta: 1_000_000.0,
            layout,
            freq_factors: factors.then(|| ff[..rot / 2].to_vec()),
            freq_base_dims: rot,
        };
        let name = format!(
            "rope {layout:?} rot {rot}{} at {pos0}",
            if factors { " ff" } else { "" },
        );
        cx.case(name, 1e-4, |cx| {
            let (gs, cs) = (step_at(&cx.gpu, pos0, n)?, step_at(&cx.cpu, pos0, n)?);
            let (g, h) = cx.t2(&x, n, heads * hd)?;
            Ok((
                host(&cx.gpu, &cx.gpu.rope(&g, heads, &gs, &rope)?)?,
                cx.cpu.rope(&h, heads, &cs, &rope)?.data,
            ))
        });
    }
    // a step of two sequences: each row at its own sequence's position
    let rope = Rope {
        head_dim: hd,
        rot_dims: hd,
        theta: 10_000.0,
        layout: RopeLayout::Neox,
        freq_factors: None,
        freq_base_dims: hd,
    };
    cx.case("rope over a step of two sequences".into(), 1e-4, |cx| {
        let (a, b) = (n / 2, n - n / 2);
        let (ia, ib) = (vec![0u32; a], vec![0u32; b]);
        let plan = StepPlan::batch(&[(&ia, 100), (&ib, 7)], LogitRows::Last)?;
        let (gs, cs) = (cx.gpu.step(plan.clone())?, cx.cpu.step(plan)?);
        let (g, h) = cx.t2(&x, n, heads * hd)?;
        Ok((
            host(&cx.gpu, &cx.gpu.rope(&g, heads, &gs, &rope)?)?,
            cx.cpu.rope(&h, heads, &cs, &rope)?.data,
        ))
    });
}

/// `moe` (bf16 operands on the GPU) vs the f32 CPU backend: the bf16 rounding of x, the weights
/// and the GLU output, over these heavy-tailed random banks. The host model of the GPU arithmetic
/// (`checks::moe::gpu_model`, bf16 mode) is 1.7e-2 .. 7.5e-2 from the CPU backend at the rows'
/// full sizes (two seeds; the max over n x 512 outputs grows with n), 1.6e-2 .. 3.4e-2 at 24
/// tokens (unit test below); as `checks::moe::E2E_CPU_BOUND`. A wrong expert, row or slot is O(1).
pub const MOE_BOUND: f64 = 0.2;

/// The prefill shapes of the `moe` rows: tokens and the case spec.
fn moe_specs() -> Vec<(usize, CaseSpec)> {
    let s = |e, k, q_gate_up, q_down, act, norm| CaseSpec {
        e,
        k,
        hidden: 512,
        ff: 256,
        q_gate_up,
        q_down,
        act,
        norm,
    };
    vec![
        // Qwen3-30B-A3B's mix (Q4_K gate/up, Q6_K down) and routing density (E 128, top-8)
        (64, s(32, 4, Quant::Q4K, Quant::Q6K, Activation::Silu, true)),
        (
            512,
            s(128, 8, Quant::Q4K, Quant::Q6K, Activation::Silu, true),
        ),
        // the 32-blocks, GeGLU, no renormalisation
        (
            200,
            s(32, 8, Quant::Q4_0, Quant::Q8_0, Activation::GeluTanh, false),
        ),
        (
            77,
            s(16, 2, Quant::Q8_0, Quant::Q4_0, Activation::Silu, true),
        ),
    ]
}

fn moe_cases(cx: &mut Ctx) {
    for (n, spec) in moe_specs() {
        let name = format!(
            "moe {}/{} n={n} E={} top-{}",
            spec.q_gate_up, spec.q_down, spec.e, spec.k
        );
        let c = match make_case_with(&mut cx.rng, n, &spec) {
            Ok(c) => c,
            Err(e) => {
                cx.case(name, MOE_BOUND, |_| Err(anyhow::anyhow!("{e}")));
                continue;
            }
        };
        cx.case(name, MOE_BOUND, |cx| {
            let gx = cx.gpu.tensor(&c.x, n, c.hidden)?;
            let gl = cx.gpu.tensor(&c.logits, n, c.p.n_experts)?;
            let g = cx.gpu.upload(&c.gate.tensor_ref("gate_exps"))?;
            let u = cx.gpu.upload(&c.up.tensor_ref("up_exps"))?;
            let d = cx.gpu.upload(&c.down.tensor_ref("down_exps"))?;
            let got = host(&cx.gpu, &cx.gpu.moe(&gx, &gl, &g, &u, &d, &c.p)?)?;
            Ok((got, cpu_moe(&c)?))
        });
    }
}

/// Render the rows like the kernel table.
pub fn format_rows(rows: &[OpRow]) -> String {
    let w = rows.iter().map(|r| r.name.len()).max().unwrap_or(8).max(8);
    let mut s = format!(
        "{:<w$}  {:>12}  {:>8}  {:>4}  note\n",
        "backend op (CUDA vs CPU)",
        "max rel err",
        "bound",
        "pass",
        w = w
    );
    for r in rows {
        s.push_str(&format!(
            "{:<w$}  {:>12}  {:>8}  {:>4}  {}\n",
            r.name,
            r.max_rel_err.map_or("-".into(), |v| format!("{v:.3e}")),
            format!("{:.0e}", r.bound),
            if r.pass { "PASS" } else { "FAIL" },
            r.note,
            w = w
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_format_like_the_kernel_table() {
        let rows = [
            OpRow {
                name: "linear q4_0 n=3 (512x1024)".into(),
                max_rel_err: Some(2.5e-6),
                bound: 1e-3,
                pass: true,
                note: String::new(),
            },
            OpRow {
                name: "embed q6_k (step ids)".into(),
                max_rel_err: None,
                bound: 0.0,
                pass: false,
                note: "error: x".into(),
            },
        ];
        let t = format_rows(&rows);
        assert!(t.contains("linear q4_0 n=3") && t.contains("2.500e-6") && t.contains("PASS"));
        assert!(t.contains("FAIL") && t.contains("error: x"), "{t}");
        // every weight type of the linear rows has a CPU path (Q5_K is the stored-as-F16 one)
        let mut rng = StdRng::seed_from_u64(1);
        for ty in LINEAR_TYPES {
            let w = weights_of(ty, 2, 256, &mut rng).unwrap();
            assert_eq!(w.len(), 2 * ty.row_bytes(256).unwrap(), "{ty:?}");
        }
    }

    /// The bf16 host model of the GPU `moe` stays well inside MOE_BOUND of the CPU backend on
    /// the rows' shapes and formats (fewer tokens: the model is slow in a debug build), and the
    /// rows take the grouped path.
    #[test]
    fn moe_bound_covers_bf16_arithmetic() {
        use crate::backend::cuda::ops::moe::pipeline::{moe_path, MoeDims, MoePath};
        use crate::selftest::moe::pipeline::{gpu_model, Mode};
        let mut worst: f64 = 0.0;
        for seed in 0..2u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            for (n, spec) in moe_specs() {
                let dims = MoeDims {
                    n,
                    experts: spec.e,
                    top_k: spec.k,
                    hidden: spec.hidden,
                    ff: spec.ff,
                    out: spec.hidden,
                };
                let q = [spec.q_gate_up, spec.q_gate_up, spec.q_down];
                assert_eq!(moe_path(n, &dims, q), MoePath::Grouped, "{spec:?}");
                let c = make_case_with(&mut rng, 24, &spec).unwrap();
                let cmp =
                    Comparison::new(&gpu_model(&c, Mode::Bf16).unwrap(), &cpu_moe(&c).unwrap());
                assert_eq!(cmp.unwritten, 0);
                eprintln!("{spec:?}: bf16 model vs cpu {:.3e}", cmp.max_rel_err);
                worst = worst.max(cmp.max_rel_err);
            }
        }
        assert!(worst > 0.0 && worst < MOE_BOUND / 2.0, "{worst}");
    }
}
