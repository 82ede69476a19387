//! Grouped MoE prefill kernels on the GPU:
//! - `moe_group` vs `ops::moe::grouped::group_tiles` (offsets and tile table exact; `perm` a
//!   permutation whose pair at each sorted position belongs to that position's expert, ids
//!   outside 0..E last): an expert with 0 pairs, one with 1, one with more than a tile, one with
//!   exactly a tile, bad ids; more experts than pairs; a skewed routing of 40k pairs; the pp512
//!   shape of Qwen3-30B-A3B (4096 pairs over 128 experts, timed);
//! - `moe_gemm` of every format: gate + up with the GLU fused (`h`, bf16, sorted rows) and
//!   `__down` (`d`, f32, pair order) against an f64 host product of the same operands (x and the
//!   weights rounded to bf16, the weights from the CPU dequantiser; the down reference takes the
//!   GPU's `h`, so the two bounds are independent): the edge-case routings above with SwiGLU and
//!   GeGLU, K not a multiple of the 64-wide stage and N not a multiple of the 64-wide tile for
//!   the 32-blocks, and the Qwen3-30B-A3B layer at pp512 (E = 128, top-8, 2048 -> 768 -> 2048,
//!   24 sampled rows checked, both launches timed).

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

use super::pipeline::{bf16, ggml, pool, ptr};
use crate::backend::cuda::ops::moe::grouped::{group_tiles, grouped_max_tiles, MoeGemmArgs};
use crate::backend::cuda::{CudaError, DevBuf, DevPtr, Pool};
use crate::backend::Activation;
use crate::kernels::{BatchBucket, HeadDim, KernelKey, KernelSpec, Op, Quant};
use crate::ops::qdot::random_weights;
use crate::quant::{bf16_to_f32, dequantize, GgmlType};
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

pub struct MoeGroupCheck;
pub struct MoeGemmCheck;

/// The `d` (down) error bound of the GEMM check: f32 accumulation of exact bf16 products vs f64
/// (as the dense `gemm` check). The check's own bound covers `h`, which the GPU rounds to bf16.
const DOWN_BOUND: f64 = 1e-4;

fn invalid(detail: String) -> CudaError {
    CudaError::Invalid {
        op: "selftest",
        detail,
    }
}

fn qerr(e: impl std::fmt::Display) -> CudaError {
    invalid(e.to_string())
}

/// `counts[e]` pairs of expert e plus the ids `extra`, in random order.
fn ids_with(rng: &mut StdRng, counts: &[usize], extra: &[i32]) -> Vec<i32> {
    let mut ids: Vec<i32> = counts
        .iter()
        .enumerate()
        .flat_map(|(e, &c)| std::iter::repeat_n(e as i32, c))
        .collect();
    ids.extend_from_slice(extra);
    ids.shuffle(rng);
    ids
}

/// `moe_group`'s outputs on the device.
struct Grouped {
    _ids: DevBuf,
    perm: DevBuf,
    offs: DevBuf,
    tiles: DevBuf,
    max_tiles: usize,
}

impl Grouped {
    fn perm_ptr(&self, pairs: usize) -> Result<DevPtr<i32>, CudaError> {
        ptr(&self.perm, pairs)
    }
    fn tiles_ptr(&self) -> Result<DevPtr<i32>, CudaError> {
        ptr(&self.tiles, 4 * self.max_tiles)
    }
}

/// Run `moe_group` over `ids` (outputs poisoned first).
fn run_group(
    cx: &CheckCtx<'_>,
    pool: &std::sync::Arc<Pool>,
    spec: &'static KernelSpec,
    ids: &[i32],
    e: usize,
    bm: usize,
) -> Result<Grouped, CudaError> {
    let pairs = ids.len();
    let max_tiles = grouped_max_tiles(pairs, e, bm);
    let ib = pool.upload(ids)?;
    let pb = pool.alloc(pairs * 4)?;
    let ob = pool.alloc((e + 1) * 4)?;
    let tb = pool.alloc(max_tiles.max(1) * 16)?;
    pb.fill_bytes(0xff)?;
    ob.fill_bytes(0xff)?;
    tb.fill_bytes(0x7f)?;
    cx.dev.moe_group(
        spec,
        ptr(&ib, pairs)?,
        ptr(&pb, pairs)?,
        ptr(&ob, e + 1)?,
        ptr(&tb, 4 * max_tiles)?,
        pairs,
        e,
        bm,
        max_tiles,
    )?;
    Ok(Grouped {
        _ids: ib,
        perm: pb,
        offs: ob,
        tiles: tb,
        max_tiles,
    })
}

/// `perm` must be a permutation of `0..pairs`.
fn check_perm(perm: &[i32]) -> Result<(), CudaError> {
    let mut seen = vec![false; perm.len()];
    for &q in perm {
        match usize::try_from(q).ok().filter(|&q| q < perm.len()) {
            Some(q) if !seen[q] => seen[q] = true,
            _ => {
                return Err(invalid(format!(
                    "moe_group: perm is not a permutation (value {q})"
                )))
            }
        }
    }
    Ok(())
}

fn f(v: &[i32]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

impl KernelCheck for MoeGroupCheck {
    fn name(&self) -> &'static str {
        "moe_group"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::MoeGroup
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        0.0 // integers: exact
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let pool = pool(cx);
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        let bm = 64usize;
        let skewed: Vec<usize> = (0..16)
            .map(|e| if e == 3 { 20_000 } else { 1_250 + 7 * e })
            .collect();
        let cases: Vec<(usize, Vec<i32>)> = vec![
            // 0 pairs, 1, more than a tile, 5, exactly a tile, 15; bad ids
            (
                6,
                ids_with(&mut cx.rng, &[0, 1, 77, 5, 64, 15], &[-1, 6, 1000]),
            ),
            (256, ids_with(&mut cx.rng, &[0, 0, 3, 0, 0, 1, 4], &[])),
            (16, ids_with(&mut cx.rng, &skewed, &[])),
            (
                128,
                (0..4096).map(|_| cx.rng.random_range(0..128)).collect(),
            ),
        ];
        for (ci, (e, ids)) in cases.iter().enumerate() {
            let (e, pairs) = (*e, ids.len());
            let g = run_group(cx, &pool, spec, ids, e, bm)?;
            let (want_offs, want_tiles) = group_tiles(ids, e, bm, g.max_tiles);
            let got_offs = g.offs.read::<i32>(e + 1)?;
            let want_o: Vec<f32> = want_offs.iter().map(|&v| v as f32).collect();
            cmp = cmp.merge(Comparison::new(&f(&got_offs), &want_o));
            let got_tiles = g.tiles.read::<i32>(4 * g.max_tiles)?;
            let want_t: Vec<i32> = want_tiles.iter().flatten().copied().collect();
            cmp = cmp.merge(Comparison::new(&f(&got_tiles), &f(&want_t)));
            let perm = g.perm.read::<i32>(pairs)?;
            check_perm(&perm)?;
            // the expert each sorted position belongs to (-1 past offs[E]) vs its pair's id
            let valid = |id: i32| if id >= 0 && (id as usize) < e { id } else { -1 };
            let got_e: Vec<i32> = perm.iter().map(|&p| valid(ids[p as usize])).collect();
            let want_e: Vec<i32> = (0..pairs)
                .map(|i| {
                    (0..e)
                        .find(|&x| want_offs[x] <= i && i < want_offs[x + 1])
                        .map_or(-1, |x| x as i32)
                })
                .collect();
            cmp = cmp.merge(Comparison::new(&f(&got_e), &f(&want_e)));
            if ci == 3 {
                let dev = cx.dev;
                let (ip, pp, op, tp) = (
                    ptr::<i32>(&g._ids, pairs)?,
                    g.perm_ptr(pairs)?,
                    ptr::<i32>(&g.offs, e + 1)?,
                    g.tiles_ptr()?,
                );
                micros = time_us(dev, cx.iters, || {
                    dev.moe_group(spec, ip, pp, op, tp, pairs, e, bm, g.max_tiles)
                })?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}

/// Expert `ex` of a bank (`rows` x `cols` of `ty` per expert) dequantised, rounded to bf16.
fn expert_bf16(
    bank: &[u8],
    ty: GgmlType,
    ex: usize,
    rows: usize,
    cols: usize,
) -> Result<Vec<f32>, CudaError> {
    let eb = rows * ty.row_bytes(cols).map_err(qerr)?;
    let mut w = vec![0f32; rows * cols];
    dequantize(ty, &bank[ex * eb..(ex + 1) * eb], &mut w).map_err(qerr)?;
    w.iter_mut().for_each(|v| *v = bf16(*v));
    Ok(w)
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// One grouped-GEMM case: routing `ids` (`top_k` slots per token) over `e` experts.
struct GemmCase {
    e: usize,
    top_k: usize,
    ids: Vec<i32>,
    hidden: usize,
    ff: usize,
    out: usize,
    act: Activation,
    /// Check this many sorted rows spread over all (0: every row).
    sample: usize,
    /// One random bank for gate, up and down (needs out == hidden; large timing case).
    shared_bank: bool,
}

/// Results of one case: (h comparison, d comparison, microseconds of both launches or 0).
fn gemm_case(
    cx: &mut CheckCtx<'_>,
    spec: &'static KernelSpec,
    gspec: &'static KernelSpec,
    c: &GemmCase,
    time: bool,
) -> Result<(Comparison, Comparison, f64), CudaError> {
    let q = spec.key.quant;
    let ty = ggml(q).ok_or_else(|| invalid(format!("no GGML type for {q}")))?;
    let bm = spec.param_u32("bm").unwrap_or(64) as usize;
    let (e, k, hid, ff, out) = (c.e, c.top_k, c.hidden, c.ff, c.out);
    let pairs = c.ids.len();
    let n = pairs.div_ceil(k);
    let pool = pool(cx);
    let gate = random_weights(ty, e * ff, hid, &mut cx.rng).map_err(qerr)?;
    let (up, down) = if c.shared_bank {
        (Vec::new(), Vec::new())
    } else {
        (
            random_weights(ty, e * ff, hid, &mut cx.rng).map_err(qerr)?,
            random_weights(ty, e * out, ff, &mut cx.rng).map_err(qerr)?,
        )
    };
    let (up, down) = if c.shared_bank {
        (&gate, &gate)
    } else {
        (&up, &down)
    };
    let x: Vec<u16> = uniform(&mut cx.rng, n * hid, -1.0, 1.0)
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    let (gb, ub, db, xb) = (
        pool.upload(&gate)?,
        pool.upload(up)?,
        pool.upload(down)?,
        pool.upload(&x)?,
    );
    let g = run_group(cx, &pool, gspec, &c.ids, e, bm)?;
    let hb = pool.alloc(pairs * ff * 2)?;
    let ob = pool.alloc(pairs * out * 4)?;
    hb.fill_bytes(0xff)?;
    ob.fill_bytes(0xff)?;
    let args = MoeGemmArgs {
        a: ptr(&xb, n * hid)?,
        perm: g.perm_ptr(pairs)?,
        tiles: g.tiles_ptr()?,
        max_tiles: g.max_tiles,
        pairs,
        top_k: k,
        n_experts: e,
        n: ff,
        k: hid,
    };
    let h = ptr::<u16>(&hb, pairs * ff)?;
    let dargs = MoeGemmArgs {
        a: h,
        n: out,
        k: ff,
        ..args
    };
    let (gp, upp, dp) = (
        ptr::<u8>(&gb, gate.len())?,
        ptr::<u8>(&ub, up.len())?,
        ptr::<u8>(&db, down.len())?,
    );
    let d = ptr::<f32>(&ob, pairs * out)?;
    let dev = cx.dev;
    dev.moe_gemm_glu(spec, &args, gp, upp, h, c.act)?;
    dev.moe_gemm_down(spec, &dargs, dp, d)?;
    let perm = g.perm.read::<i32>(pairs)?;
    check_perm(&perm)?;
    let h_got: Vec<f32> = hb
        .read::<u16>(pairs * ff)?
        .iter()
        .map(|&b| bf16_to_f32(b))
        .collect();
    let d_got = ob.read::<f32>(pairs * out)?;
    let xf: Vec<f32> = x.iter().map(|&b| bf16_to_f32(b)).collect();

    // sorted rows to check, grouped by expert (one dequantisation per expert)
    let rows: Vec<usize> = if c.sample == 0 || c.sample >= pairs {
        (0..pairs).collect()
    } else {
        (0..c.sample)
            .map(|i| i * (pairs - 1) / (c.sample - 1))
            .collect()
    };
    let mut by_expert: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &i in &rows {
        let id = c.ids[perm[i] as usize];
        let ex = usize::try_from(id)
            .ok()
            .filter(|&v| v < e)
            .ok_or_else(|| invalid(format!("pair {} has expert {id}", perm[i])))?;
        by_expert.entry(ex).or_default().push(i);
    }
    let (mut hg, mut hw, mut dg, mut dw) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (&ex, list) in &by_expert {
        let wg = expert_bf16(&gate, ty, ex, ff, hid)?;
        let wu = expert_bf16(up, ty, ex, ff, hid)?;
        let wd = expert_bf16(down, ty, ex, out, ff)?;
        for &i in list {
            let p = perm[i] as usize;
            let xr = &xf[(p / k) * hid..][..hid];
            for j in 0..ff {
                let gv = dot(xr, &wg[j * hid..][..hid]) as f32;
                let uv = dot(xr, &wu[j * hid..][..hid]) as f32;
                let a = match c.act {
                    Activation::Silu => crate::ops::silu(gv),
                    Activation::GeluTanh => crate::ops::gelu_tanh(gv),
                };
                hw.push(a * uv);
                hg.push(h_got[i * ff + j]);
            }
            let hr = &h_got[i * ff..][..ff];
            for col in 0..out {
                dw.push(dot(hr, &wd[col * ff..][..ff]) as f32);
                dg.push(d_got[p * out + col]);
            }
        }
    }
    let mut ch = Comparison::new(&hg, &hw);
    let mut cd = Comparison::new(&dg, &dw);
    // every row written, sampled or not
    ch.unwritten += h_got.iter().filter(|v| v.is_nan()).count();
    cd.unwritten += d_got.iter().filter(|v| v.is_nan()).count();
    let micros = if time {
        time_us(dev, cx.iters, || {
            dev.moe_gemm_glu(spec, &args, gp, upp, h, c.act)?;
            dev.moe_gemm_down(spec, &dargs, dp, d)
        })?
    } else {
        0.0
    };
    Ok((ch, cd, micros))
}

impl KernelCheck for MoeGemmCheck {
    fn name(&self) -> &'static str {
        "moe_gemm"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::MoeGemm
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        // h: the GPU rounds act(g) * u to bf16 (half a bf16 ulp: up to 2^-8 of the value, 3.9e-3
        // at most; 3.5e-3 .. 3.9e-3 in a host emulation of the kernel) and accumulates in f32;
        // d: DOWN_BOUND. An indexing bug (wrong expert, row or column) is O(1).
        5e-3
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let gspec = cx
            .dev
            .resolve(Op::MoeGroup, Quant::F32, HeadDim::Any, BatchBucket::Any)?;
        let kq = matches!(spec.key.quant, Quant::Q4K | Quant::Q6K);
        // 32-blocks: K = 96 (a half stage at the end), out = 100 (a partial column tile)
        let (hidden, ff, out) = if kq { (512, 256, 200) } else { (96, 96, 100) };
        let edge = [
            (vec![0usize, 1, 77, 5, 64, 15], Activation::Silu),
            (vec![130, 0, 3, 0, 33, 2], Activation::GeluTanh),
        ];
        let mut cmp = Comparison::default();
        let mut down = Comparison::default();
        for (counts, act) in edge {
            let ids = ids_with(&mut cx.rng, &counts, &[]);
            let c = GemmCase {
                e: counts.len(),
                top_k: 2,
                ids,
                hidden,
                ff,
                out,
                act,
                sample: 0,
                shared_bank: false,
            };
            let (h, d, _) = gemm_case(cx, spec, gspec, &c, false)?;
            cmp = cmp.merge(h).merge(d);
            down = down.merge(d);
        }
        // Qwen3-30B-A3B at pp512: 512 tokens x top-8 over 128 experts, 2048 -> 768 -> 2048
        let ids: Vec<i32> = (0..512 * 8).map(|_| cx.rng.random_range(0..128)).collect();
        let c = GemmCase {
            e: 128,
            top_k: 8,
            ids,
            hidden: 2048,
            ff: 768,
            out: 2048,
            act: Activation::Silu,
            sample: 24,
            shared_bank: true,
        };
        let (h, d, micros) = gemm_case(cx, spec, gspec, &c, true)?;
        cmp = cmp.merge(h).merge(d);
        down = down.merge(d);
        if !down.passes(DOWN_BOUND) {
            return Err(invalid(format!(
                "moe_gemm__down: max rel err {:.3e} (unwritten {}) > {DOWN_BOUND:e}",
                down.max_rel_err, down.unwritten
            )));
        }
        Ok(Measured { cmp, micros })
    }
}
