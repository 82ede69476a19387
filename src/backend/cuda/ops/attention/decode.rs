//! Typed launches of the decode-step kernels: attention over the paged FP8 / F16 KV cache
//! (split-K with the merge fused into the same launch) and the sampler.

use crate::kernels::Entry;
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};

use super::launch::kv_elem_bytes;
use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::{drv, CudaError};
use crate::backend::cuda::runtime::types::Q8Ptrs;
use crate::backend::cuda::CudaDevice;
use crate::kernels::{KernelKey, KernelSpec, Op, Quant};
use crate::ops::sample::SampleParams;

// SAFETY: `SampleParams` is #[repr(C)] plain data with the kernel's `SampleParams` layout
// (f32, i32, f32, f32, u64: 24 bytes).
unsafe impl DeviceRepr for SampleParams {}

fn invalid(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

/// Shape and options of one decode-attention launch (one query token per sequence).
#[derive(Debug, Clone, Copy)]
pub struct AttnDecodeLaunch {
    /// Sequences in the batch.
    pub batch: usize,
    pub hq: usize,
    pub hkv: usize,
    /// Blocks per (sequence, KV head), each taking hq / hkv / head_split query heads (divides
    /// the group; 1 = the whole group in one block).
    pub head_split: usize,
    /// Tokens per KV page; the caches are [pages][hkv][page_size][head_dim] of the kernel's
    /// quant (FP8 E4M3 or F16).
    pub page_size: usize,
    /// Columns of the block table ([batch][max_pages] i32).
    pub max_pages: usize,
    /// Split-K grid (grid.x, 1..=[`MAX_DECODE_SPLITS`]), fixed per cache so one captured graph
    /// serves every position. The kernel cuts the LIVE keys into chunks of
    /// max(`min_chunk`, ceil(live / splits) rounded up to the tile) keys; blocks past the last
    /// live chunk exit at once.
    pub splits: usize,
    /// Fewest keys per chunk (>= 1; a multiple of the tile keeps tiles whole).
    pub min_chunk: usize,
    pub scale: f32,
    /// 0 = off.
    pub softcap: f32,
    /// 0 = full attention.
    pub window: usize,
    /// Which entry of the instance runs (the tensor-core `__mma` one where it exists by default).
    pub entry: DecodeEntry,
    /// How the whole-group entry's split partials are merged (ignored by the other entries).
    pub gqa_merge: GqaMerge,
}

/// How the whole-group entry (`__gqa`) merges its split partials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GqaMerge {
    /// [`gqa_fused_merge_default`] from the launch's shape.
    #[default]
    Auto,
    /// In `__gqa` itself: the last block of each (sequence, KV head) to finish merges the
    /// group's partials (arrival counters, as the per-head entries); no second launch. Correct
    /// at every shape, fast where [`gqa_fused_merge_fits`].
    Fused,
    /// A `<name>__gqa_merge` launch after `__gqa` (spread over many blocks: the large groups).
    Separate,
}

/// Most query-head dims (group x head dim) of a fused `__gqa` merge: its 256 threads take one
/// float4 column of the group's output each (at most).
pub const GQA_FUSED_MERGE_MAX_DIMS: usize = 1024;
/// Most splits (grid.x) of a fused `__gqa` merge: a thread issues the loads of 16 splits at once.
pub const GQA_FUSED_MERGE_MAX_SPLITS: usize = 16;

/// Whether the last `__gqa` block merges the group's partials itself at this shape: where they
/// fit one load batch of the block, group x head dim <= [`GQA_FUSED_MERGE_MAX_DIMS`] and splits
/// <= [`GQA_FUSED_MERGE_MAX_SPLITS`] (at most 64 KB of partials, every thread's loads in
/// flight at once: one L2 round trip instead of a second launch of ~2 us). Gemma 4's sliding
/// layers (2 x 256 over 16 splits: 32 KB) fit; its global ones (16 x 512 over up to 64 splits:
/// 2 MB, 32 dependent round trips on one SM) keep `__gqa_merge`, which spreads them over 128
/// blocks. From the shape only (the grid, never the live length), so one captured graph
/// serves every position.
pub fn gqa_fused_merge_fits(group: usize, head_dim: usize, splits: usize) -> bool {
    group
        .checked_mul(head_dim)
        .is_some_and(|x| x <= GQA_FUSED_MERGE_MAX_DIMS)
        && splits <= GQA_FUSED_MERGE_MAX_SPLITS
}

/// [`GqaMerge::Auto`]: [`gqa_fused_merge_fits`], unless `FUCINA_GQA_FUSED_MERGE=0` (read once)
/// forces the separate merge launch.
pub fn gqa_fused_merge_default(group: usize, head_dim: usize, splits: usize) -> bool {
    gqa_fused_merge_fits(group, head_dim, splits) && crate::tuning::get().gqa_fused_merge
}

/// The entry point of a decode-attention instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodeEntry {
    /// [`decode_mma_default`]: the tensor-core entry where the instance has one.
    #[default]
    Auto,
    /// The scalar entry: one warp per query head, f32 dot products.
    Scalar,
    /// The tensor-core entry (`<name>__mma`): an error for instances without it.
    Mma,
    /// The whole-group tensor-core entry (`<name>__gqa`, head dim 512): one 8-warp block per
    /// (split, KV head) takes every query head of the group; needs `head_split` 1. An error for
    /// instances without it.
    Gqa,
}

/// Whether an instance has the tensor-core entry `__mma` (ops/attn_decode renders it on sm_89+
/// for head dim 128, and 256 over FP8: mma.sync f16 with exact FP8/F16 -> f16 conversions of
/// the cache).
pub fn decode_has_mma(spec: &KernelSpec) -> bool {
    decode_key_has_mma(&spec.key)
}

/// [`decode_has_mma`] by key.
pub fn decode_key_has_mma(key: &KernelKey) -> bool {
    let dim_ok = match key.head_dim.value() {
        Some(128) => true,
        Some(256) => key.quant == Quant::Fp8E4m3,
        _ => false,
    };
    key.op == Op::AttnDecode && dim_ok && key.arch.sm() >= 89
}

/// Whether an instance has `__mmaw` (ops/attn_decode renders it beside `__mma` at head dim 128):
/// `__mma` whose split merge loads 48 partials at a time, which the tensor-core entry runs for
/// blocks of at most [`MMAW_MAX_HEADS`] query heads.
pub fn decode_key_has_mmaw(key: &KernelKey) -> bool {
    decode_key_has_mma(key) && key.head_dim.value() == Some(128)
}

/// Most query heads of a block that runs `__mmaw` (128 threads: at its 253 registers two blocks
/// share an SM; a 256-thread block takes the whole register file, and Qwen3-30B-A3B's group of 8
/// ran depth 0 0.9% slower so, H200).
pub const MMAW_MAX_HEADS: usize = 4;

/// Whether an instance has the whole-group entries `__gqa` and `__gqa_merge` (ops/attn_decode
/// renders them on sm_89+ for head dims 256 and 512, FP8 and F16 caches).
pub fn decode_key_has_gqa(key: &KernelKey) -> bool {
    key.op == Op::AttnDecode
        && matches!(key.head_dim.value(), Some(256 | 512))
        && key.arch.sm() >= 89
}

/// Whether [`DecodeEntry::Auto`] runs `__gqa` (at `head_split` 1): where the instance has it,
/// unless `FUCINA_ATTN_GQA=0` (read once). Measured on H200 (Gemma 4 12B Q4_0, decode at depth
/// 0 / 4096): 330.3 / 304.2 tok/s with `__gqa` at head dim 512 only, 338.8 / 324.2 with it at
/// 256 too (and its 64-key splits), 325.3 / 286.2 without it.
pub fn decode_gqa_default(spec: &KernelSpec) -> bool {
    decode_key_has_gqa(&spec.key) && crate::tuning::get().attn_gqa
}

/// The entry [`DecodeEntry::Auto`] runs for the per-head entries: `__mma` where the instance has
/// it, unless `FUCINA_ATTN_MMA=0` (read once).
pub fn decode_mma_default(spec: &KernelSpec) -> bool {
    decode_has_mma(spec) && crate::tuning::get().attn_mma
}

/// Most bytes of the `__mma` entry's dynamic shared memory: its G warps' partials of the G
/// heads of the block, G x G x d f32 (G <= 8, G x d <= 1024: 32 KB). Sized per launch (8 KB for
/// Qwen3's 4 heads of 128) where a static array of the most took 32 KB a block.
const MMA_PARTIALS_MAX: usize = 8 * 1024 * 4;

/// Most splits of one decode-attention launch (the kernel's MAXS).
pub const MAX_DECODE_SPLITS: usize = 64;
/// Most query heads one decode-attention block takes (the kernel's GMAX):
/// hq / hkv / head_split must not exceed it.
pub const MAX_DECODE_BLOCK_HEADS: usize = 8;

/// Scratch of the split-K partials: o [batch][hq][splits][d] and {m, l} [batch][hq][splits],
/// and the per-(sequence, KV head, head share) arrival counters (u32 [batch][hkv][head_split],
/// zero; the kernel leaves them zero).
pub struct AttnScratch {
    pub part_o: CudaSlice<f32>,
    pub part_ml: CudaSlice<f32>,
    pub counters: CudaSlice<u32>,
}

impl CudaDevice {
    pub fn attn_scratch(
        &self,
        p: &AttnDecodeLaunch,
        head_dim: usize,
    ) -> Result<AttnScratch, CudaError> {
        let rows = p.batch * p.hq * p.splits;
        Ok(AttnScratch {
            part_o: self.filled_f32(rows * head_dim, 0.0)?,
            part_ml: self.filled_f32(rows * 2, 0.0)?,
            counters: self.upload(&vec![0u32; (p.batch * p.hkv * p.head_split).max(1)])?,
        })
    }

    /// Decode attention, one launch: `q` f32 [batch][hq][d] -> `out` f32 [batch][hq][d]; `q_pos`
    /// i32 [batch] in device memory: the query's position (its K/V already in the cache, so the
    /// sequence holds q_pos + 1 keys). `part_o` / `part_ml` are the split-K scratch
    /// ([batch][hq][splits][d] and [batch][hq][splits][2] f32, any contents); `counters` u32
    /// [batch][hkv][head_split] must be zero before the launch and are zero again after it (the last split
    /// of each KV head merges the partials and resets its counter), so a persistent zeroed
    /// buffer serves every launch and graph replay on one stream.
    #[allow(clippy::too_many_arguments)]
    pub fn attn_decode(
        &self,
        spec: &'static KernelSpec,
        p: &AttnDecodeLaunch,
        q: DevPtr<f32>,
        k_cache: DevPtr<u8>,
        v_cache: DevPtr<u8>,
        scales: super::launch::KvScales,
        block_table: DevPtr<i32>,
        q_pos: DevPtr<i32>,
        part_o: DevPtr<f32>,
        part_ml: DevPtr<f32>,
        out: DevPtr<f32>,
        q8: Option<Q8Ptrs>,
        counters: DevPtr<u32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "attn_decode";
        if spec.key.op != Op::AttnDecode {
            return Err(invalid(
                OP,
                format!("instance {} is not attn_decode", spec.name),
            ));
        }
        let d = spec
            .key
            .head_dim
            .value()
            .ok_or_else(|| invalid(OP, "instance has no head_dim".into()))?
            as usize;
        let kvb = kv_elem_bytes(spec.key.quant)
            .ok_or_else(|| invalid(OP, format!("no cache layout for {}", spec.key.quant)))?;
        let gqa_auto = decode_gqa_default(spec) && p.head_split == 1;
        let entry = match p.entry {
            DecodeEntry::Auto if gqa_auto => DecodeEntry::Gqa,
            DecodeEntry::Auto if decode_mma_default(spec) => DecodeEntry::Mma,
            DecodeEntry::Auto => DecodeEntry::Scalar,
            DecodeEntry::Mma if !decode_has_mma(spec) => {
                return Err(invalid(
                    OP,
                    format!("{} has no tensor-core entry", spec.name),
                ));
            }
            DecodeEntry::Gqa if !decode_key_has_gqa(&spec.key) => {
                return Err(invalid(
                    OP,
                    format!("{} has no whole-group entry", spec.name),
                ));
            }
            e => e,
        };
        // heads per block: the whole group for `__gqa` (head_split 1), else at most GMAX (and
        // for `__mma` partials within its shared memory)
        let g = p
            .hkv
            .checked_mul(p.head_split)
            .and_then(|m| p.hq.checked_div(m))
            .unwrap_or(0);
        let block_heads_ok = match entry {
            DecodeEntry::Gqa => p.head_split == 1,
            DecodeEntry::Mma => {
                p.head_split > 0 && g <= MAX_DECODE_BLOCK_HEADS && g * g * d * 4 <= MMA_PARTIALS_MAX
            }
            _ => p.head_split > 0 && g <= MAX_DECODE_BLOCK_HEADS,
        };
        if p.hkv == 0
            || p.hq % p.hkv != 0
            || p.hq / p.hkv > 16
            || p.head_split == 0
            || (p.hq / p.hkv) % p.head_split != 0
            || !block_heads_ok
            || p.batch == 0
            || p.splits == 0
            || p.splits > MAX_DECODE_SPLITS
            || p.min_chunk == 0
            || p.page_size == 0
            || p.max_pages == 0
        {
            return Err(invalid(
                OP,
                format!(
                    "hq={} hkv={} (group <= 16) head_split={} (divides the group, leaves <= \
                     {MAX_DECODE_BLOCK_HEADS} heads per block; 1 for the whole-group entry), batch={}, \
                     splits={} (1..={MAX_DECODE_SPLITS}), min_chunk={}, page={}, max_pages={}",
                    p.hq,
                    p.hkv,
                    p.head_split,
                    p.batch,
                    p.splits,
                    p.min_chunk,
                    p.page_size,
                    p.max_pages
                ),
            ));
        }
        let rows = p.batch * p.hq;
        if q.len() < rows * d
            || out.len() < rows * d
            || q_pos.len() < p.batch
            || block_table.len() < p.batch * p.max_pages
        {
            return Err(invalid(
                OP,
                "q / out / q_pos / block_table too small".into(),
            ));
        }
        let (xq, xds) = q8.unwrap_or((DevPtr::null(), DevPtr::null()));
        if q8.is_some() && (d % 128 != 0 || xq.len() < rows * d || xds.len() < rows * d / 16) {
            return Err(invalid(
                OP,
                format!("int8 side-car for {rows} rows of {d}: head dim not a multiple of 128, or too small"),
            ));
        }
        if part_o.len() < rows * p.splits * d
            || part_ml.len() < rows * p.splits * 2
            || counters.len() < p.batch * p.hkv * p.head_split
        {
            return Err(invalid(OP, "scratch too small for these splits".into()));
        }
        let page_bytes = p.hkv * p.page_size * d * kvb;
        if k_cache.len() != v_cache.len() || k_cache.len() % page_bytes != 0 {
            return Err(invalid(
                OP,
                "caches are not whole pages of [hkv][page_size][d]".into(),
            ));
        }
        // an FP8 cache's row scales: one per row of the caches
        let cache_rows = k_cache.len() / (d * kvb);
        if kvb == 1 && (scales.k.len() < cache_rows || scales.v.len() < cache_rows) {
            return Err(invalid(
                OP,
                format!(
                    "an FP8 cache of {cache_rows} rows with {} / {} scales",
                    scales.k.len(),
                    scales.v.len()
                ),
            ));
        }
        let (ksr, vsr) = scales.raw();
        // the whole-group entry's merge: in `__gqa` itself, or a second launch
        let fused = entry == DecodeEntry::Gqa
            && match p.gqa_merge {
                GqaMerge::Auto => gqa_fused_merge_default(p.hq / p.hkv, d, p.splits),
                GqaMerge::Fused => true,
                GqaMerge::Separate => false,
            };
        // static shared memory, and `__mma`'s partials (at most 8 heads x 1024 floats)
        let merge = match entry {
            DecodeEntry::Gqa if !fused => {
                Some(self.function_entry_smem(spec, Entry::GqaMerge, 0)?)
            }
            _ => None,
        };
        let f = match entry {
            DecodeEntry::Mma if g <= MMAW_MAX_HEADS && decode_key_has_mmaw(&spec.key) => {
                self.function_entry_smem(spec, Entry::Mmaw, MMA_PARTIALS_MAX)?
            }
            DecodeEntry::Mma => self.function_entry_smem(spec, Entry::Mma, MMA_PARTIALS_MAX)?,
            DecodeEntry::Gqa => self.function_entry_smem(spec, Entry::Gqa, 0)?,
            _ => self.function(spec)?,
        };
        let i = |v: usize| i32::try_from(v).map_err(|_| invalid(OP, format!("{v} exceeds i32")));
        let (hq, hkv, hsplit, pg, mp, win, min_chunk) = (
            i(p.hq)?,
            i(p.hkv)?,
            i(p.head_split)?,
            i(p.page_size)?,
            i(p.max_pages)?,
            i(p.window)?,
            i(p.min_chunk)?,
        );
        let _ = i(p.max_pages * p.page_size)?;
        if p.batch > 65535 || p.hkv * p.head_split > 65535 {
            return Err(invalid(
                OP,
                "batch or KV heads x head_split past 65535".into(),
            ));
        }
        let cfg = LaunchConfig {
            // KV heads fastest: the blocks of split 0 (the only live ones at short depth) are
            // dispatched first, ahead of those that exit at once
            grid_dim: (
                (p.hkv * p.head_split) as u32,
                p.splits as u32,
                p.batch as u32,
            ),
            // one warp per query head of the block; 8 warps for the whole group
            block_dim: match entry {
                DecodeEntry::Gqa => (256, 1, 1),
                _ => (32 * (p.hq / p.hkv / p.head_split) as u32, 1, 1),
            },
            // `__mma`: its warps' partials, [warp][head][d] f32 (at most 8 x 1024 floats)
            shared_mem_bytes: match entry {
                DecodeEntry::Mma => (g * g * d * 4) as u32,
                _ => 0,
            },
        };
        let (qr, kr, vr, btr, posr, por, pmr, outr, cr) = (
            q.raw(),
            k_cache.raw(),
            v_cache.raw(),
            block_table.raw(),
            q_pos.raw(),
            part_o.raw(),
            part_ml.raw(),
            out.raw(),
            counters.raw(),
        );
        let mut b = self.stream().launch_builder(&f);
        b.arg(&qr)
            .arg(&kr)
            .arg(&vr)
            .arg(&btr)
            .arg(&posr)
            .arg(&por)
            .arg(&pmr)
            .arg(&outr)
            .arg(&cr);
        b.arg(&hq)
            .arg(&hkv)
            .arg(&hsplit)
            .arg(&pg)
            .arg(&mp)
            .arg(&min_chunk)
            .arg(&p.scale)
            .arg(&ksr)
            .arg(&vsr)
            .arg(&p.softcap)
            .arg(&win);
        let (xqr, xdsr) = (xq.raw(), xds.raw());
        b.arg(&xqr).arg(&xdsr);
        let fused_merge = i32::from(fused);
        if entry == DecodeEntry::Gqa {
            b.arg(&fused_merge);
        }
        // SAFETY: matches ops/attn_decode (q, k_cache, v_cache, block_table, q_pos, part_o,
        // part_ml, out, counters, hq, hkv, head_split, page_size, max_pages, min_chunk, scale,
        // k_scales, v_scales (an FP8 cache's row scales, checked above; null for f16),
        // softcap, window, xq, xds: null or [batch][hq][d] int8 and
        // [batch][hq][d / 32] float2, checked above; `__gqa` also fused_merge: i32); sizes checked
        // above (with head_split 1 the counters are [batch][hkv]); the kernel clamps the key
        // count to max_pages * page_size and touches part_o / part_ml / counters only below
        // [batch][hq][splits] / [batch][hkv][head_split]; block table entries must be < the cache's pages
        // (the caller's contract: kv.rs passes an identity table).
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        if let Some(m) = merge {
            // the whole-group entry's merge: block (head of the group x 128 dims, KV head, sequence)
            let splits = i(p.splits)?;
            let cfg = LaunchConfig {
                grid_dim: (
                    (p.hq / p.hkv * d / 128) as u32,
                    p.hkv as u32,
                    p.batch as u32,
                ),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream().launch_builder(&m);
            b.arg(&posr).arg(&por).arg(&pmr).arg(&outr);
            b.arg(&hq)
                .arg(&hkv)
                .arg(&pg)
                .arg(&mp)
                .arg(&min_chunk)
                .arg(&win)
                .arg(&splits)
                .arg(&xqr)
                .arg(&xdsr);
            // SAFETY: matches `<name>__gqa_merge` in lib/attn_decode_gqa (q_pos, part_o, part_ml,
            // out, hq, hkv, page_size, max_pages, min_chunk, window, splits, xq, xds), the same buffers
            // and sizes as the launch above.
            unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}__gqa_merge", spec.name)))?;
        }
        Ok(())
    }

    /// One token per row of `logits` ([rows][vocab]) into `out`; `counters[r]` selects the draw
    /// of row r's random stream and is incremented by the kernel. `scratch`: rows x
    /// `sample_scratch_words(vocab)` u32, zero before the first launch (left reusable); `None`
    /// runs the single-block reference entry instead.
    #[allow(clippy::too_many_arguments)]
    pub fn sample(
        &self,
        spec: &'static KernelSpec,
        logits: &CudaSlice<f32>,
        vocab: usize,
        params: &CudaSlice<SampleParams>,
        counters: &mut CudaSlice<u32>,
        out: &mut CudaSlice<i32>,
        scratch: Option<&mut CudaSlice<u32>>,
    ) -> Result<(), CudaError> {
        let (l, p, c, o) = (
            DevPtr::of(logits),
            DevPtr::of(params),
            DevPtr::of(&*counters),
            DevPtr::of(&*out),
        );
        match scratch {
            Some(s) => {
                self.sample_ptr(spec, l, vocab, p, c, o, DevPtr::of(&*s), Default::default())
            }
            None => self.sample_one_block_ptr(spec, l, vocab, p, c, o, Default::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        decode_key_has_gqa, decode_key_has_mma, decode_key_has_mmaw, gqa_fused_merge_fits,
        GQA_FUSED_MERGE_MAX_DIMS, GQA_FUSED_MERGE_MAX_SPLITS,
    };
    use crate::kernels::{Entry, Op, KERNELS};

    /// The decode-attention instances whose rendered source defines the entry `e` (the
    /// registry's list), checking that `rule` names exactly those (the template decides by head
    /// dim, cache type and arch).
    fn rendered_entries(e: Entry, rule: fn(&crate::kernels::KernelKey) -> bool) -> usize {
        let mut with = 0;
        for spec in KERNELS.iter().filter(|s| s.key.op == Op::AttnDecode) {
            let rendered = spec.entry(e).is_some();
            assert_eq!(rule(&spec.key), rendered, "{}", spec.name);
            with += rendered as usize;
        }
        with
    }

    /// The tensor-core entry `__mma`: head dim 128 (FP8 and F16) and 256 (FP8) on sm_90a and
    /// sm_121a.
    #[test]
    fn mma_rule_matches_the_rendered_entries() {
        let with = rendered_entries(Entry::Mma, decode_key_has_mma);
        assert!(with >= 6, "{with} instances with a tensor-core entry");
    }

    /// The wide-merge entry `__mmaw`: head dim 128 (FP8 and F16) on sm_90a and sm_121a.
    #[test]
    fn mmaw_rule_matches_the_rendered_entries() {
        let with = rendered_entries(Entry::Mmaw, decode_key_has_mmaw);
        assert!(with >= 4, "{with} instances with a wide-merge entry");
    }

    /// The whole-group entry `__gqa`: head dims 256 and 512, FP8 and F16 caches, on sm_90a and
    /// sm_121a.
    #[test]
    fn gqa_rule_matches_the_rendered_entries() {
        let with = rendered_entries(Entry::Gqa, decode_key_has_gqa);
        assert!(with >= 8, "{with} instances with a whole-group entry");
    }

    /// The fused `__gqa` merge: Gemma 4's sliding layers (2 x 256, 16 splits: 32 KB of partials)
    /// and the other small groups, not its global layers (16 x 512) nor more than 16 splits.
    #[test]
    fn fused_merge_choice_follows_the_partials_size() {
        // Gemma 4 12B sliding layers at every capacity (1..=16 splits of a 1024-key window)
        for splits in 1..=16 {
            assert!(gqa_fused_merge_fits(2, 256, splits), "{splits}");
        }
        // Gemma 4 global layers: 16 query heads of 512 over one KV head, at any grid
        for splits in [1, 8, 16, 64] {
            assert!(!gqa_fused_merge_fits(16, 512, splits), "{splits}");
        }
        // Gemma 3's full-attention layers (2 x 256) over a long cache: 64 splits
        assert!(!gqa_fused_merge_fits(2, 256, 64));
        assert!(!gqa_fused_merge_fits(2, 256, 17));
        // the edges: a full column per thread, one batch of 16 loads
        assert!(gqa_fused_merge_fits(4, 256, 16));
        assert!(gqa_fused_merge_fits(2, 512, 16));
        assert!(!gqa_fused_merge_fits(3, 512, 1));
        assert!(!gqa_fused_merge_fits(8, 256, 4));
        // no overflow
        assert!(!gqa_fused_merge_fits(usize::MAX, 512, 1));
        // the bound in bytes: at most 64 KB of f32 partials per (sequence, KV head)
        assert_eq!(
            GQA_FUSED_MERGE_MAX_DIMS * GQA_FUSED_MERGE_MAX_SPLITS * 4,
            64 << 10
        );
        for g in 1..=16 {
            for d in [256, 512] {
                for splits in 1..=64 {
                    let fits = gqa_fused_merge_fits(g, d, splits);
                    assert_eq!(fits, g * d <= 1024 && splits <= 16, "{g} x {d}, {splits}");
                    if fits {
                        assert!(g * d * splits * 4 <= 64 << 10);
                    }
                }
            }
        }
    }
}
