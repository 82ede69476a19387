//! Decode attention over a paged FP8 E4M3 (a scale per row, rows of magnitudes 2^-6 .. 2^6) or
//! F16 KV cache vs `ops::attention_ref` on the dequantised cache at head dims 16..512: GQA groups 1..16, pages handed out in shuffled order,
//! several sequences of different lengths in one launch (1, 255, 256, 257: one tile, one chunk
//! and the merge of 2 and 3 chunks), 4097 and 4100 keys (33 live chunks: the fused merge walks
//! more splits than a warp has lanes), 6500 keys at head dim 128 (51 live chunks: `__mmaw`'s merge
//! takes a second batch), sliding windows, softcap, grids much larger than the live
//! chunks (blocks past them exit), groups split over several blocks per KV head (as the backend
//! picks: Gemma 4's 16 x 512 over 1 KV head -> 8; forced 4 at head dim 16), and at head dim 512
//! the whole-group entry (one block per KV head and split), with its partials merged both ways:
//! by the separate `__gqa_merge` launch and inside `__gqa` by the last block (forced at every
//! shape, so the fused merge's loop over many columns and splits runs too; Gemma 4's sliding
//! layers, 16 heads of 256 over 8 KV heads with 16 splits, window or not, take it by default). The
//! kernel reads query positions (length - 1) from device memory. Every case runs twice, first
//! with the int8 side-car, then without, each into a fresh NaN output, and the arrival counters
//! must be zero after each launch (the kernel resets them: what lets one persistent buffer serve
//! every graph replay).

use crate::backend::cuda::ops::attention::kv::{decode_head_split, decode_launch_head_split};
use crate::backend::cuda::KvScales;
use crate::backend::cuda::{
    decode_gqa_default, decode_has_mma, decode_key_has_gqa, decode_key_has_mma, AttnDecodeLaunch,
    CudaError, DecodeEntry, DevPtr, GqaMerge, GQA_MIN_SPLIT_KEYS, MIN_SPLIT_KEYS,
};
use crate::backend::kv_type::fp8_row_scale;
use crate::kernels::{KernelKey, KernelSpec, Op, Quant};
use crate::ops::attention_ref::{attention_decode, DecodeAttn};
use crate::ops::qdot::quantize_q8_1;
use crate::quant::{e4m3_to_f32, f32_to_e4m3};
use crate::selftest::check::{time_us, CheckCtx, Comparison, KernelCheck, Measured};
use rand::seq::SliceRandom;
use rand::Rng;

pub struct AttnDecodeCheck;

struct Case {
    hq: usize,
    hkv: usize,
    lens: Vec<usize>,
    window: usize,
    softcap: f32,
    splits: usize,
    /// Blocks per KV head (0: `decode_head_split`, what the backend uses).
    head_split: usize,
}

fn cases(d: usize) -> Vec<Case> {
    let c = |hq, hkv, lens: &[usize], window, softcap, splits| Case {
        hq,
        hkv,
        lens: lens.to_vec(),
        window,
        softcap,
        splits,
        head_split: 0,
    };
    let mut v = match d {
        // the golden models' shapes: 4 query heads over 2 KV heads (window 4) or over 1 (global)
        16 => vec![
            c(4, 2, &[37, 1], 4, 0.0, 2),
            c(8, 2, &[300], 0, 30.0, 4),
            c(16, 1, &[130, 64], 0, 0.0, 3),
            // 4 blocks per KV head, 4 query heads each
            Case {
                head_split: 4,
                ..c(16, 1, &[300, 1], 0, 0.0, 3)
            },
        ],
        32 => vec![
            c(4, 1, &[70, 3], 0, 0.0, 2),
            c(4, 2, &[129], 4, 0.0, 1),
            c(16, 4, &[500], 200, 20.0, 5),
        ],
        64 => vec![c(8, 2, &[900, 5], 0, 0.0, 8), c(4, 1, &[200], 100, 20.0, 3)],
        // Qwen3-8B at depth 4096 first (the timed case): 34 splits as for its 4240-token cache
        128 => vec![
            c(32, 8, &[4097], 0, 0.0, 34),
            c(32, 8, &[1000, 37], 0, 0.0, 8),
            c(4, 4, &[300], 0, 0.0, 1),
            // a group of 16 over 2 KV heads: 2 blocks per KV head
            c(32, 2, &[600, 3], 0, 0.0, 8),
            // Qwen3-MoE's group of 8, with a window and a softcap (both entries)
            c(32, 4, &[700, 50], 300, 30.0, 4),
            // 51 live chunks of 128 keys: `__mmaw`'s merge takes a second batch past its 48
            c(4, 1, &[6500], 0, 0.0, 64),
        ],
        256 => vec![
            c(16, 8, &[1500, 700], 1024, 50.0, 6),
            c(8, 1, &[513], 0, 0.0, 16),
            // Gemma 4's sliding layers (group 2, window 1024, 16 splits of 64 keys: the fused
            // merge by default): a full window of 16 live chunks and 5 of them; then no window
            c(16, 8, &[1100, 300], 1024, 0.0, 16),
            c(16, 8, &[700, 65], 0, 0.0, 16),
        ],
        // Gemma 4's global layers at depth 4096 first (the timed case): 16 heads over 1, 64 splits
        _ => vec![
            c(16, 1, &[4097], 0, 0.0, 64),
            c(16, 1, &[777, 1], 0, 0.0, 8),
            c(16, 2, &[300, 65], 0, 30.0, 3),
            c(8, 2, &[2000], 512, 30.0, 4),
        ],
    };
    // one launch: a single key, one tile short of a chunk, one chunk, and 2 / 3 merged chunks
    v.push(c(8, 2, &[1, 255, 256, 257], 0, 0.0, 16));
    // 33 live chunks of a 64-split grid (the merge walks more splits than 32 lanes), and a
    // sliding window of 1000 over 4100 keys (8 live chunks starting at key 3100)
    v.push(c(8, 2, &[4100], 0, 0.0, 64));
    v.push(c(4, 2, &[4100, 1001], 1000, 0.0, 64));
    // 40 keys over 32 splits: one live chunk, 31 blocks exit at once
    v.push(c(4, 2, &[40], 0, 0.0, 32));
    v
}

/// A cache's contents for rows of `d` values `x` as the kernels store them: the bytes in the
/// instance's element type, the value each element decodes to and, for FP8, each row's f16
/// scale (`crate::backend::kv_type`: `e4m3(x / s)`, read back as `e4m3 * s`; empty for F16).
pub(in crate::selftest) fn encode_kv(
    quant: Quant,
    x: &[f32],
    d: usize,
) -> (Vec<u8>, Vec<f32>, Vec<u16>) {
    match quant {
        Quant::F16 => {
            let h: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
            let bytes = h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
            (bytes, h.iter().map(|v| v.to_f32()).collect(), Vec::new())
        }
        _ => {
            let (mut b, mut f, mut s) = (Vec::with_capacity(x.len()), Vec::new(), Vec::new());
            for row in x.chunks(d) {
                let sc = fp8_row_scale(row);
                let (sf, inv) = (sc.to_f32(), 1.0 / sc.to_f32());
                for &v in row {
                    let c = f32_to_e4m3(v * inv);
                    b.push(c);
                    f.push(e4m3_to_f32(c) * sf);
                }
                s.push(sc.to_bits());
            }
            (b, f, s)
        }
    }
}

/// Rows of `d` values with magnitudes spread over 2^-6 .. 2^6 (each row its own), so an FP8
/// cache's scales differ from row to row.
pub(in crate::selftest) fn spread_rows(
    rng: &mut impl Rng,
    n: usize,
    d: usize,
    amp: f32,
) -> Vec<f32> {
    let mut x = Vec::with_capacity(n);
    while x.len() < n {
        let m = 2f32.powf(rng.random_range(-6.0f32..6.0));
        for _ in 0..d.min(n - x.len()) {
            x.push((rng.random::<f32>() - 0.5) * amp * m);
        }
    }
    x
}

impl KernelCheck for AttnDecodeCheck {
    fn name(&self) -> &'static str {
        "attn_decode"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::AttnDecode
    }
    fn bound(&self, key: &KernelKey) -> f64 {
        if decode_key_has_mma(key) || decode_key_has_gqa(key) {
            // the tensor-core entries round q and the probabilities to f16 (2^-11 relative each;
            // measured 9.8e-4 max-abs/max-ref on H200 over the cases below for `__mma`)
            4e-3
        } else {
            2e-3 // f32 with __expf against f64 (measured ~5e-7 max-abs/max-ref on H200)
        }
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let d = spec.key.head_dim.value().unwrap_or(0) as usize;
        let page = 64usize;
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        for (ci, c) in cases(d).into_iter().enumerate() {
            let rng = &mut cx.rng;
            let b = c.lens.len();
            let max_pages = c.lens.iter().max().copied().unwrap_or(1).div_ceil(page);
            let pages = b * max_pages;
            let mut order: Vec<i32> = (0..pages as i32).collect();
            order.shuffle(rng);
            let n = pages * c.hkv * page * d;
            // rows of every magnitude (each FP8 row its own scale); K's range kept moderate so
            // the scores stay finite in the softmax and not all on one key
            let kx = spread_rows(rng, n, d, 4.0 / 64.0);
            let vx = spread_rows(rng, n, d, 4.0);
            let (kc, kf, ksc) = encode_kv(spec.key.quant, &kx, d);
            let (vc, vf, vsc) = encode_kv(spec.key.quant, &vx, d);
            let q: Vec<f32> = (0..b * c.hq * d)
                .map(|_| rng.random::<f32>() - 0.5)
                .collect();
            let mut p = AttnDecodeLaunch {
                batch: b,
                hq: c.hq,
                hkv: c.hkv,
                head_split: match c.head_split {
                    0 => decode_head_split(c.hq / c.hkv, d),
                    s => s,
                },
                page_size: page,
                max_pages,
                splits: c.splits,
                min_chunk: MIN_SPLIT_KEYS,
                scale: 1.0 / (d as f32).sqrt(),
                softcap: c.softcap,
                window: c.window,
                entry: DecodeEntry::Scalar,
                gqa_merge: GqaMerge::Auto,
            };
            let mut want = Vec::new();
            for (s, &len) in c.lens.iter().enumerate() {
                let (mut kd, mut vd) = (vec![0f32; len * c.hkv * d], vec![0f32; len * c.hkv * d]);
                for j in 0..len {
                    let pg = order[s * max_pages + j / page] as usize;
                    for h in 0..c.hkv {
                        let (src, dst) = (
                            ((pg * c.hkv + h) * page + j % page) * d,
                            (j * c.hkv + h) * d,
                        );
                        kd[dst..dst + d].copy_from_slice(&kf[src..src + d]);
                        vd[dst..dst + d].copy_from_slice(&vf[src..src + d]);
                    }
                }
                let r = DecodeAttn {
                    hq: c.hq,
                    hkv: c.hkv,
                    head_dim: d,
                    scale: p.scale,
                    softcap: c.softcap,
                    window: c.window,
                };
                let o = attention_decode(&q[s * c.hq * d..(s + 1) * c.hq * d], &kd, &vd, len, &r)
                    .map_err(|e| CudaError::Invalid {
                    op: "selftest",
                    detail: e.to_string(),
                })?;
                want.extend(o);
            }
            // the kernel takes the query positions: length - 1
            let qpos: Vec<i32> = c.lens.iter().map(|&l| l as i32 - 1).collect();
            let (dq, dk, dv) = (cx.dev.upload(&q)?, cx.dev.upload(&kc)?, cx.dev.upload(&vc)?);
            let (dbt, dl) = (cx.dev.upload(&order)?, cx.dev.upload(&qpos)?);
            let fp8 = !ksc.is_empty();
            let (dks, dvs) = (
                cx.dev.upload(if fp8 { &ksc } else { &[0u16][..] })?,
                cx.dev.upload(if fp8 { &vsc } else { &[0u16][..] })?,
            );
            let scales = if fp8 {
                KvScales {
                    k: DevPtr::of(&dks),
                    v: DevPtr::of(&dvs),
                }
            } else {
                KvScales::none()
            };
            let scratch = cx.dev.attn_scratch(&p, d)?;
            let dev = cx.dev;
            // every entry of the instance (scalar, and tensor-core where it has one); the
            // timing is the default entry's. The case's head split serves the per-head entries
            // (and is the largest: the counters are sized for it); the whole-group entry takes
            // 1, Auto what the backend passes.
            let case_split = p.head_split;
            let mut entries = vec![(DecodeEntry::Scalar, GqaMerge::Auto)];
            if decode_has_mma(spec) {
                entries.push((DecodeEntry::Mma, GqaMerge::Auto));
            }
            if decode_key_has_gqa(&spec.key) {
                entries.push((DecodeEntry::Gqa, GqaMerge::Separate));
                entries.push((DecodeEntry::Gqa, GqaMerge::Fused));
            }
            entries.push((DecodeEntry::Auto, GqaMerge::Auto));
            for (entry, merge) in entries {
                p.entry = entry;
                p.gqa_merge = merge;
                p.head_split = match entry {
                    DecodeEntry::Gqa => 1,
                    DecodeEntry::Auto if c.head_split == 0 => {
                        decode_launch_head_split(spec, c.hq / c.hkv, d)
                    }
                    _ => case_split,
                };
                // the whole-group entry's splits are 64 keys (as the backend passes)
                let gqa = entry == DecodeEntry::Gqa
                    || (entry == DecodeEntry::Auto
                        && p.head_split == 1
                        && decode_gqa_default(spec));
                p.min_chunk = if gqa {
                    GQA_MIN_SPLIT_KEYS
                } else {
                    MIN_SPLIT_KEYS
                };
                let p = &p;
                let launch = |out: &DevPtr<f32>, q8| {
                    dev.attn_decode(
                        spec,
                        p,
                        DevPtr::of(&dq),
                        DevPtr::of(&dk),
                        DevPtr::of(&dv),
                        scales,
                        DevPtr::of(&dbt),
                        DevPtr::of(&dl),
                        DevPtr::of(&scratch.part_o),
                        DevPtr::of(&scratch.part_ml),
                        *out,
                        q8,
                        DevPtr::of(&scratch.counters),
                    )
                };
                let zeros = vec![0f32; scratch.counters.len()];
                // twice on the same counters: with the side-car (head dims of whole 128s: what
                // the backend asks for), then without
                for with_side in [true, false] {
                    // a fresh NaN output per run: no run passes on another's results
                    let out = dev.filled_f32(b * c.hq * d, f32::NAN)?;
                    // and a fresh side-car
                    let side = if with_side && d % 128 == 0 {
                        let n = b * c.hq * d;
                        Some((
                            dev.upload(&vec![0x55i8; n])?,
                            dev.filled_f32(n / 16, f32::NAN)?,
                        ))
                    } else {
                        None
                    };
                    let q8 = side
                        .as_ref()
                        .map(|(xq, xds)| (DevPtr::of(xq), DevPtr::of(xds)));
                    launch(&DevPtr::of(&out), q8)?;
                    let got = cx.dev.download(&out)?;
                    if let Some((xq, xds)) = &side {
                        side_car_exact(
                            &got,
                            &dev.download(xq)?,
                            &dev.download(xds)?,
                            entry,
                            merge,
                        )?;
                    }
                    cmp = cmp.merge(Comparison::new(&got, &want));
                    let counters: Vec<f32> = cx
                        .dev
                        .download(&scratch.counters)?
                        .iter()
                        .map(|&v| v as f32)
                        .collect();
                    cmp = cmp.merge(Comparison::new(&counters, &zeros));
                    if ci == 0 && entry == DecodeEntry::Auto && with_side {
                        micros = time_us(dev, cx.iters, || launch(&DevPtr::of(&out), q8))?;
                        cmp = cmp.merge(Comparison::new(&cx.dev.download(&out)?, &want));
                    }
                }
            }
        }
        Ok(Measured { cmp, micros })
    }
}

/// The int8 side-car an entry wrote must be, byte for byte, what `quantize_q8` makes of the
/// output it wrote (`ops::qdot::quantize_q8_1`, which is bit-identical to that kernel).
fn side_car_exact(
    out: &[f32],
    q: &[i8],
    ds: &[f32],
    entry: DecodeEntry,
    merge: GqaMerge,
) -> Result<(), CudaError> {
    let bad = |detail: String| CudaError::Invalid {
        op: "selftest attn_decode side-car",
        detail: format!("{entry:?} (gqa merge {merge:?}): {detail}"),
    };
    let want = quantize_q8_1(out).map_err(|e| bad(e.to_string()))?;
    if let Some(i) = (0..out.len()).find(|&i| q[i] != want.qs[i]) {
        return Err(bad(format!("value {i}: int8 {} != {}", q[i], want.qs[i])));
    }
    for g in 0..want.d.len() {
        let (d, s) = (ds[2 * g], ds[2 * g + 1]);
        if d.to_bits() != want.d[g].to_bits() || s.to_bits() != want.s[g].to_bits() {
            return Err(bad(format!(
                "group {g}: {{d, d * sum}} = {{{d}, {s}}}, want {{{}, {}}}",
                want.d[g], want.s[g]
            )));
        }
    }
    Ok(())
}
