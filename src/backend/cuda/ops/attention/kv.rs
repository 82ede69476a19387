//! The KV cache on the device and attention over it: cache allocation, writes of new K/V rows
//! (converted to the cache type), and attention of any number of query rows (decode: one row;
//! prefill: many) over the cached positions.
//!
//! Positions come from device memory (`pos`: one i32 per row), so a decode step that calls these
//! can be captured once and replayed as a CUDA graph at any position.
//!
//! Layout: K and V are `[ring_pages][n_kv_heads][KV_PAGE][head_dim]` of the cache type (FP8 E4M3
//! or F16). Position j lives on page `(j / KV_PAGE) % ring_pages`: every page of the capacity in
//! identity order, or, for a sliding-window layer (`KvShape::ring`), a ring of the pages its
//! window and one prefill chunk need. `extra` holds the block table (i32 `[pages]`: logical page
//! -> allocated page) the split-K decode kernel reads, followed by its arrival counters (u32
//! `[n_kv_heads][16]`: per KV head and head share, zeroed here and left zero by every decode
//! launch). FP8 scales every row (one position of one KV head) on its own
//! (`crate::backend::kv_type`): `scales` holds an f16 scale per row for K, then for V, written
//! with the row, so no value is clamped to E4M3's +-448 nor lost in its subnormals. The caches
//! are zeroed when allocated (the scales too: a row not written reads as 0).

use std::sync::Arc;

use super::arena::{ArenaKind, KvArena};
use super::decode::{
    decode_gqa_default, AttnDecodeLaunch, DecodeEntry, GqaMerge, MAX_DECODE_BLOCK_HEADS,
    MAX_DECODE_SPLITS,
};
use super::launch::{AttnPrefillLaunch, KvLayout, KvScales};
use crate::backend::cuda::ops::attention::cache::{GpuKvCache, KvMem};
use crate::backend::cuda::runtime::buf::{DevBuf, DevPtr, Pool};
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::types::{KvType, Q8Ptrs};
use crate::backend::cuda::CudaDevice;
use crate::backend::{AttnParams, KvShape};
use crate::kernels::{BatchBucket, HeadDim, KernelSpec, Op, Quant};

/// Positions per page of the paged layout.
pub const KV_PAGE: usize = 64;
/// Most decode blocks (splits x KV heads) of a full cache: ~4 per SM of an H200 (132 SMs).
const DECODE_BLOCKS: usize = 512;
/// Fewest keys a decode split covers: one 128-key tile. Qwen3-8B (8 KV heads) at depth 4096 then
/// runs 33 live splits = 264 blocks, exactly 2 per H200 SM, each one tile (256-key splits would
/// give 136 blocks: 4 SMs with two 2-tile blocks set the time); at depth <= 128 one block per KV
/// head writes the output with no merge.
pub const MIN_SPLIT_KEYS: usize = 128;
/// Fewest keys a split of the whole-group entry (`__gqa`) covers: one 64-key round. Its blocks
/// take a KV head's whole group, so there are fewer of them: Gemma 4 12B decodes at 338.8 / 324.2
/// tok/s (depth 0 / 4096) against 336.2 / 319.2 with 128-key splits (the sliding layers, 8 KV
/// heads over a 1024-key window, get 16 splits instead of 8; H200), where the per-head
/// entries of Qwen3 lose 1.5-8.5% with 64.
pub const GQA_MIN_SPLIT_KEYS: usize = 64;

/// The fewest keys per split of a launch (`gqa`: the whole-group entry runs), or
/// `FUCINA_ATTN_MIN_CHUNK` (a multiple of 32, for A/B runs; read once) for every entry.
fn min_split_keys(gqa: bool) -> usize {
    crate::tuning::get().attn_min_chunk.unwrap_or(if gqa {
        GQA_MIN_SPLIT_KEYS
    } else {
        MIN_SPLIT_KEYS
    })
}
/// Most decode splits.
const MAX_SPLITS: usize = MAX_DECODE_SPLITS;
/// Most query-head rows x head dim one decode block takes (`decode_head_split`): Qwen3's
/// 4 x 128 and Qwen3-MoE's 8 x 128 stay whole; Gemma 4's global 16 x 512 splits 8 ways.
const DECODE_HEAD_WORK: usize = 1024;
/// Most head shares per KV head (the group is at most 16): counters per KV head in `extra`.
const MAX_HEAD_SPLIT: usize = 16;

fn bad(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

/// The kernels' quant for a cache type.
pub fn kv_quant(t: KvType) -> Quant {
    match t {
        KvType::Fp8E4m3 => Quant::Fp8E4m3,
        // an f32 cache is refused when the backend is made (CudaBackend::with_device)
        KvType::F16 | KvType::F32 => Quant::F16,
    }
}

/// The compile-time head dim of the attention kernels (16, 32, 64, 128, 256, 512).
pub fn kv_head_dim(d: usize) -> Option<HeadDim> {
    match d {
        16 => Some(HeadDim::D16),
        32 => Some(HeadDim::D32),
        64 => Some(HeadDim::D64),
        128 => Some(HeadDim::D128),
        256 => Some(HeadDim::D256),
        512 => Some(HeadDim::D512),
        _ => None,
    }
}

/// The paged layout of a cache of `shape` and `kv_type`: a ring of whole pages holding at least
/// `shape.ring` positions, or every page of the capacity.
pub fn kv_layout(shape: &KvShape, kv_type: KvType) -> KvLayout {
    let pages = shape.capacity.div_ceil(KV_PAGE);
    KvLayout {
        hkv: shape.n_kv_heads,
        head_dim: shape.head_dim,
        page_size: KV_PAGE,
        capacity: shape.capacity,
        ring_pages: shape.ring.map_or(pages, |s| s.div_ceil(KV_PAGE).min(pages)),
        elem_bytes: kv_type.bytes(),
    }
}

/// Validate a cache shape (host side, before allocating).
pub fn check_kv_shape(shape: &KvShape) -> Result<(), CudaError> {
    if shape.n_kv_heads == 0
        || shape.capacity == 0
        || shape.ring == Some(0)
        || kv_head_dim(shape.head_dim).is_none()
    {
        return Err(bad(
            "kv_cache",
            format!(
                "{shape:?}: need heads > 0, capacity > 0, a ring of > 0 slots and head_dim 16, \
                 32, 64, 128, 256 or 512"
            ),
        ));
    }
    if shape.capacity.div_ceil(KV_PAGE) * KV_PAGE > i32::MAX as usize {
        return Err(bad(
            "kv_cache",
            format!("capacity {} exceeds i32", shape.capacity),
        ));
    }
    Ok(())
}

/// Host-side check of a write or attention at positions `pos0 .. pos0 + n` (the backend knows
/// pos0): every position must be below the capacity.
pub fn check_kv_positions(cache: &GpuKvCache, pos0: usize, n: usize) -> Result<(), CudaError> {
    check_positions_shape(&cache.shape, pos0, n)
}

fn check_positions_shape(s: &KvShape, pos0: usize, n: usize) -> Result<(), CudaError> {
    match pos0.checked_add(n) {
        Some(end) if end <= s.capacity => Ok(()),
        _ => Err(bad(
            "kv_write",
            format!(
                "positions {pos0}..{pos0}+{n} past the cache capacity {}",
                s.capacity
            ),
        )),
    }
}

/// Validate attention parameters against a cache (host side).
pub fn check_attention(
    cache: &GpuKvCache,
    n: usize,
    max_pos: usize,
    p: &AttnParams,
) -> Result<(), CudaError> {
    check_attention_shape(&cache.shape, n, max_pos, p)
}

fn check_attention_shape(
    s: &KvShape,
    n: usize,
    max_pos: usize,
    p: &AttnParams,
) -> Result<(), CudaError> {
    if p.n_kv_heads != s.n_kv_heads || p.head_dim != s.head_dim {
        return Err(bad(
            "attention",
            format!(
                "params ({} kv heads x {}) over a cache of {} x {}",
                p.n_kv_heads, p.head_dim, s.n_kv_heads, s.head_dim
            ),
        ));
    }
    if p.n_kv_heads == 0 || p.n_heads % p.n_kv_heads != 0 || p.n_heads / p.n_kv_heads > 16 {
        return Err(bad(
            "attention",
            format!(
                "{} query heads over {} KV heads (group of at most 16)",
                p.n_heads, p.n_kv_heads
            ),
        ));
    }
    if n == 0 {
        return Err(bad("attention", "no query rows".into()));
    }
    if max_pos >= s.capacity {
        return Err(bad(
            "attention",
            format!("position {max_pos} past the cache capacity {}", s.capacity),
        ));
    }
    if p.softcap.is_some_and(|c| !(c.is_finite() && c > 0.0)) || !p.scale.is_finite() {
        return Err(bad(
            "attention",
            format!("softcap {:?} scale {}", p.softcap, p.scale),
        ));
    }
    if p.window.is_some_and(|w| w == 0 || w > i32::MAX as usize) {
        return Err(bad("attention", format!("window {:?}", p.window)));
    }
    Ok(())
}

/// Split-K grid of decode attention, from the cache capacity and the window only (so a captured
/// graph is valid at every position): one split per `min_chunk` keys of the longest live range
/// (capacity, or the window when smaller), at most [`DECODE_BLOCKS`] blocks over the KV heads and
/// [`MAX_SPLITS`]. The kernel cuts the live keys of each launch into chunks of at least
/// `min_chunk`; blocks past them exit at once, so the cost follows the live length.
pub fn decode_splits(
    capacity: usize,
    n_kv_heads: usize,
    window: Option<usize>,
    min_chunk: usize,
) -> usize {
    let range = window.map_or(capacity, |w| w.min(capacity));
    let by_blocks = DECODE_BLOCKS.div_ceil(n_kv_heads.max(1));
    let by_keys = range.div_ceil(min_chunk.max(1));
    by_blocks.min(by_keys).clamp(1, MAX_SPLITS)
}

/// Blocks per (sequence, KV head) of decode attention: the smallest divisor of the GQA group
/// that leaves each block at most [`MAX_DECODE_BLOCK_HEADS`] heads and at most
/// [`DECODE_HEAD_WORK`] query-head dims (a wide group over few KV heads, e.g. Gemma 4's 16 heads
/// of 512 over 1, would otherwise leave most SMs idle).
pub fn decode_head_split(group: usize, head_dim: usize) -> usize {
    let group = group.max(1);
    (1..=group)
        .find(|&s| {
            group % s == 0
                && group / s <= MAX_DECODE_BLOCK_HEADS
                && (group / s) * head_dim <= DECODE_HEAD_WORK
        })
        .unwrap_or(group)
}

/// The head split a decode launch of `spec` uses with [`DecodeEntry::Auto`]: 1 where the
/// whole-group entry runs (`decode_gqa_default`), else [`decode_head_split`].
pub fn decode_launch_head_split(spec: &KernelSpec, group: usize, head_dim: usize) -> usize {
    if decode_gqa_default(spec) {
        1
    } else {
        decode_head_split(group, head_dim)
    }
}

/// A cache's own extras: the block table of its one-sequence decode launches (logical page ->
/// page of the cache: identity, or modulo the ring), then their arrival counters (zero).
fn cache_extra(pool: &Arc<Pool>, shape: &KvShape, layout: &KvLayout) -> Result<DevBuf, CudaError> {
    let ring = layout.ring_pages as i32;
    let mut table: Vec<i32> = (0..layout.pages() as i32).map(|p| p % ring).collect();
    table.resize(layout.pages() + shape.n_kv_heads * MAX_HEAD_SPLIT, 0);
    pool.upload_recycled(&table)
}

impl CudaDevice {
    /// A cache for `shape.capacity` positions of `shape.n_kv_heads` heads of `shape.head_dim`.
    pub fn kv_cache_new(
        &self,
        pool: &Arc<Pool>,
        shape: KvShape,
        kv_type: KvType,
    ) -> Result<GpuKvCache, CudaError> {
        check_kv_shape(&shape)?;
        let layout = kv_layout(&shape, kv_type);
        // recycled: a dropped session's cache serves the next session's (no driver call)
        let k = pool.alloc_recycled(layout.bytes())?;
        let v = pool.alloc_recycled(layout.bytes())?;
        // zeroed, so that a tile that reaches past the written keys reads finite values
        k.fill_bytes(0)?;
        v.fill_bytes(0)?;
        let scales = match kv_type {
            KvType::Fp8E4m3 => {
                let s = pool.alloc_recycled(layout.rows() * 2 * 2)?;
                s.fill_bytes(0)?;
                Some(s)
            }
            _ => None,
        };
        Ok(GpuKvCache {
            shape,
            kv_type,
            len: 0,
            extra: Some(cache_extra(pool, &shape, &layout)?),
            mem: KvMem::Own { k, v, scales },
        })
    }

    /// The caches of one sequence of `shapes` in a slot of `arena` (zeroed, as new caches
    /// are); None where the arena does not take them (other shapes, no free slot).
    pub fn kv_caches_in(
        &self,
        pool: &Arc<Pool>,
        arena: &Arc<KvArena>,
        shapes: &[KvShape],
        kv_type: KvType,
    ) -> Result<Option<Vec<GpuKvCache>>, CudaError> {
        for s in shapes {
            check_kv_shape(s)?;
        }
        let layouts: Vec<KvLayout> = shapes.iter().map(|s| kv_layout(s, kv_type)).collect();
        let Some(slots) = arena.lease(pool, (shapes, &layouts), kv_type)? else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(shapes.len());
        for ((shape, layout), slot) in shapes.iter().zip(&layouts).zip(slots) {
            out.push(GpuKvCache {
                shape: *shape,
                kv_type,
                len: 0,
                extra: Some(cache_extra(pool, shape, layout)?),
                mem: KvMem::Slot(slot),
            });
        }
        Ok(Some(out))
    }

    /// Write `n` rows of `k`, `v` (f32 `[n, n_kv_heads * head_dim]`) at the positions `pos[0..n]`
    /// (device memory). Updates `cache.len` to `max(len, last host-known position + 1)` is the
    /// caller's job (the backend knows pos0 on the host; [`check_kv_positions`] checks the range).
    /// Positions at or past the capacity are the caller's error; the kernel skips them.
    pub fn kv_write(
        &self,
        cache: &mut GpuKvCache,
        pos: DevPtr<i32>,
        k: DevPtr<f32>,
        v: DevPtr<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let spec = self.resolve(
            Op::KvWrite,
            kv_quant(cache.kv_type),
            HeadDim::Any,
            BatchBucket::Any,
        )?;
        let layout = kv_layout(&cache.shape, cache.kv_type);
        let (kc, vc, scales) = cache.memory()?;
        self.kv_write_rows(spec, &layout, n, scales, k, v, pos, kc, vc)
    }

    /// Causal attention of `n` query rows `q` (f32 `[n, n_heads * head_dim]`, row i at position
    /// `pos[i]`, device memory) over the cache's positions `0 ..= pos[i]` (limited by
    /// `p.window`), GQA by `p.n_heads / p.n_kv_heads`, scores times `p.scale`, optional tanh
    /// soft-cap. `max_pos` is a host-side bound on every `pos[i]` (checked against the
    /// capacity). Returns `[n, n_heads * head_dim]` f32 from `pool`.
    ///
    /// n == 1: split-K decode (launch independent of the position: graph-capturable); with
    /// `q8` it also writes the output's int8 side-car there (head dims of whole 128s), what
    /// `quantize_q8` would make of it;
    /// n > 1: the prefill kernel over all rows at once.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        pool: &Arc<Pool>,
        q: DevPtr<f32>,
        n: usize,
        cache: &GpuKvCache,
        pos: DevPtr<i32>,
        max_pos: usize,
        p: &AttnParams,
        q8: Option<Q8Ptrs>,
    ) -> Result<DevBuf, CudaError> {
        check_attention(cache, n, max_pos, p)?;
        if q8.is_some() && (n != 1 || p.head_dim % 128 != 0) {
            return Err(bad(
                "attention",
                format!(
                    "an int8 side-car needs one row and a head dim of whole 128s ({n} x {})",
                    p.head_dim
                ),
            ));
        }
        let d = p.head_dim;
        let hd = kv_head_dim(d).ok_or_else(|| bad("attention", format!("head_dim {d}")))?;
        let quant = kv_quant(cache.kv_type);
        let rows = n * p.n_heads * d;
        if q.len() < rows || pos.len() < n {
            return Err(bad(
                "attention",
                format!("{n} rows: q {} pos {}", q.len(), pos.len()),
            ));
        }
        let out = pool.alloc(rows * 4)?;
        let layout = kv_layout(&cache.shape, cache.kv_type);
        let (kc, vc, scales) = cache.memory()?;
        let softcap = p.softcap.unwrap_or(0.0);
        let window = p.window.unwrap_or(0);
        if n == 1 {
            let spec = self.resolve(Op::AttnDecode, quant, hd, BatchBucket::Any)?;
            let extra = cache
                .extra
                .as_ref()
                .ok_or_else(|| bad("attention", "cache without a block table".into()))?
                .ptr::<i32>();
            let pages = layout.pages();
            let lp = decode_launch(spec, p, 1, cache.shape.capacity, pages);
            let (table, counters) = extra
                .slice(0, pages)
                .zip(extra.slice(pages, p.n_kv_heads * lp.head_split))
                .ok_or_else(|| bad("attention", "block table without counters".into()))?;
            self.decode_into(
                pool,
                spec,
                &lp,
                (q, pos, d),
                (kc, vc, scales),
                table,
                (out.f32(), q8),
                counters.cast::<u32>(),
            )?;
        } else {
            let spec = self.resolve(Op::AttnPrefill, quant, hd, BatchBucket::Any)?;
            let lp = AttnPrefillLaunch {
                n,
                hq: p.n_heads,
                hkv: p.n_kv_heads,
                scale: p.scale,
                softcap,
                window,
            };
            self.attn_prefill(spec, &lp, &layout, q, pos, kc, vc, scales, out.f32())?;
        }
        Ok(out)
    }
}

/// The split-K decode launch of `batch` sequences of a cache of `capacity` positions in `pages`
/// pages: head split, fewest keys per split and splits from the cache and the parameters only
/// (not the batch, not the position), so a sequence is split the same way alone, in a batch and
/// in every replay of a captured step.
fn decode_launch(
    spec: &KernelSpec,
    p: &AttnParams,
    batch: usize,
    capacity: usize,
    pages: usize,
) -> AttnDecodeLaunch {
    let head_split = decode_launch_head_split(spec, p.n_heads / p.n_kv_heads, p.head_dim);
    let min_chunk = min_split_keys(head_split == 1 && decode_gqa_default(spec));
    AttnDecodeLaunch {
        batch,
        hq: p.n_heads,
        hkv: p.n_kv_heads,
        head_split,
        page_size: KV_PAGE,
        max_pages: pages,
        splits: decode_splits(capacity, p.n_kv_heads, p.window, min_chunk),
        min_chunk,
        scale: p.scale,
        softcap: p.softcap.unwrap_or(0.0),
        window: p.window.unwrap_or(0),
        entry: DecodeEntry::Auto,
        gqa_merge: GqaMerge::Auto,
    }
}

impl CudaDevice {
    /// `lp` over `q` (heads of `d`) at `pos` into `out` (and its int8 side-car `q8`), the split
    /// partials from `pool`.
    #[allow(clippy::too_many_arguments)]
    fn decode_into(
        &self,
        pool: &Arc<Pool>,
        spec: &'static KernelSpec,
        lp: &AttnDecodeLaunch,
        (q, pos, d): (DevPtr<f32>, DevPtr<i32>, usize),
        (kc, vc, scales): (DevPtr<u8>, DevPtr<u8>, KvScales),
        table: DevPtr<i32>,
        (out, q8): (DevPtr<f32>, Option<Q8Ptrs>),
        counters: DevPtr<u32>,
    ) -> Result<(), CudaError> {
        let heads = lp.batch * lp.hq;
        let part_o = pool.alloc(heads * lp.splits * d * 4)?;
        let part_ml = pool.alloc(heads * lp.splits * 2 * 4)?;
        self.attn_decode(
            spec,
            lp,
            q,
            kc,
            vc,
            scales,
            table,
            pos,
            part_o.f32(),
            part_ml.f32(),
            out,
            q8,
            counters,
        )
    }

    /// Decode attention of one query row per sequence (`q` f32 `[slots.len(), n_heads *
    /// head_dim]`, row b at position `pos[b]`) over the caches of `ordinal` in `kind` of the KV
    /// arena, sequence b's in slot `slots[b]`: one launch, a block table row per sequence, each
    /// sequence split as [`Self::attention`]'s decode branch splits it alone (the same blocks
    /// compute it, in the same order: a row's output is the one it gets alone). The checks of
    /// each sequence's cache are the caller's. Returns `[slots.len(), n_heads * head_dim]` f32
    /// from `pool`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_slots(
        &self,
        pool: &Arc<Pool>,
        q: DevPtr<f32>,
        kind: &ArenaKind,
        (ordinal, arena_slots): (usize, usize),
        slots: &[usize],
        pos: DevPtr<i32>,
        p: &AttnParams,
    ) -> Result<DevBuf, CudaError> {
        let (b, d) = (slots.len(), p.head_dim);
        let hd = kv_head_dim(d).ok_or_else(|| bad("attention", format!("head_dim {d}")))?;
        let layout = &kind.layout;
        if b == 0 || p.n_kv_heads != layout.hkv || d != layout.head_dim {
            return Err(bad(
                "attention",
                format!(
                    "{b} sequences of {} KV heads x {d} over caches of {} x {}",
                    p.n_kv_heads, layout.hkv, layout.head_dim
                ),
            ));
        }
        let rows = b * p.n_heads * d;
        if q.len() < rows || pos.len() < b {
            return Err(bad(
                "attention",
                format!("{b} rows: q {} pos {}", q.len(), pos.len()),
            ));
        }
        let spec = self.resolve(Op::AttnDecode, kv_quant(kind.kv_type), hd, BatchBucket::Any)?;
        // each sequence split as its own launch splits it (`decode_launch` from the capacity and
        // window, not the batch): its output does not depend on what else is in the batch
        let lp = decode_launch(spec, p, b, layout.capacity, layout.pages());
        let table = kind.table(pool, slots)?;
        let counters = kind
            .counters(b * p.n_kv_heads * lp.head_split)
            .ok_or_else(|| {
                bad(
                    "attention",
                    format!("{b} sequences past the arena's counters"),
                )
            })?;
        let (kc, vc, scales) = kind
            .base(ordinal, arena_slots)
            .ok_or_else(|| bad("attention", format!("cache {ordinal} past the arena")))?;
        let out = pool.alloc(rows * 4)?;
        self.decode_into(
            pool,
            spec,
            &lp,
            (q, pos, d),
            (kc, vc, scales),
            table,
            (out.f32(), None),
            counters,
        )?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(hkv: usize, d: usize, cap: usize) -> KvShape {
        KvShape::full(hkv, d, cap)
    }

    #[test]
    fn rings_round_up_to_whole_pages_within_the_capacity() {
        let ring = |slots| KvShape {
            ring: Some(slots),
            ..shape(8, 256, 10_000)
        };
        let l = kv_layout(&ring(1087), KvType::Fp8E4m3);
        assert_eq!((l.pages(), l.ring_pages), (157, 17));
        assert_eq!(l.bytes(), 17 * 8 * 64 * 256);
        assert_eq!(kv_layout(&ring(64), KvType::F16).ring_pages, 1);
        // a ring no smaller than the capacity is the whole cache
        assert_eq!(kv_layout(&ring(20_000), KvType::F16).ring_pages, 157);
        assert_eq!(
            kv_layout(&shape(8, 256, 10_000), KvType::F16).ring_pages,
            157
        );
        assert!(check_kv_shape(&ring(0)).is_err());
        assert!(check_kv_shape(&ring(1)).is_ok());
    }

    #[test]
    fn shapes_and_types() {
        assert!(check_kv_shape(&shape(8, 128, 4096)).is_ok());
        assert!(check_kv_shape(&shape(8, 512, 1)).is_ok());
        assert!(check_kv_shape(&shape(0, 128, 4096)).is_err());
        assert!(check_kv_shape(&shape(8, 96, 4096)).is_err());
        assert!(check_kv_shape(&shape(2, 16, 64)).is_ok());
        assert!(check_kv_shape(&shape(1, 32, 64)).is_ok());
        assert!(check_kv_shape(&shape(2, 8, 64)).is_err());
        assert!(check_kv_shape(&shape(2, 48, 64)).is_err());
        assert_eq!(kv_head_dim(16), Some(HeadDim::D16));
        assert_eq!(kv_head_dim(32), Some(HeadDim::D32));
        assert!(check_kv_shape(&shape(8, 128, 0)).is_err());
        assert!(check_kv_shape(&shape(8, 128, usize::MAX / 2)).is_err());
        assert_eq!(kv_quant(KvType::Fp8E4m3), Quant::Fp8E4m3);
        assert_eq!(kv_quant(KvType::F16), Quant::F16);
        let l = kv_layout(&shape(4, 256, 100), KvType::F16);
        assert_eq!((l.pages(), l.page_size, l.elem_bytes), (2, KV_PAGE, 2));
        assert_eq!(l.bytes(), 2 * 4 * 64 * 256 * 2);
    }

    #[test]
    fn splits_depend_on_capacity_and_window_only_and_stay_in_range() {
        assert_eq!(decode_splits(1, 8, None, MIN_SPLIT_KEYS), 1);
        assert_eq!(decode_splits(128, 8, None, MIN_SPLIT_KEYS), 1);
        assert_eq!(decode_splits(129, 8, None, MIN_SPLIT_KEYS), 2);
        // the bench's Qwen3-8B cache: 4240 positions, 8 KV heads -> 34 splits (33 live at 4096)
        assert_eq!(decode_splits(4240, 8, None, MIN_SPLIT_KEYS), 34);
        assert_eq!(decode_splits(32768, 8, None, MIN_SPLIT_KEYS), MAX_SPLITS);
        assert_eq!(decode_splits(32768, 16, None, MIN_SPLIT_KEYS), 32);
        assert_eq!(decode_splits(1 << 20, 1, None, MIN_SPLIT_KEYS), MAX_SPLITS);
        assert_eq!(decode_splits(4096, 0, None, MIN_SPLIT_KEYS), 32);
        // a sliding window bounds the live range
        assert_eq!(decode_splits(32768, 8, Some(1024), MIN_SPLIT_KEYS), 8);
        assert_eq!(decode_splits(100, 8, Some(1024), MIN_SPLIT_KEYS), 1);
        // the whole-group entry's 64-key splits: Gemma 4's sliding layers get 16
        assert_eq!(decode_splits(32768, 8, Some(1024), GQA_MIN_SPLIT_KEYS), 16);
        assert_eq!(decode_splits(4240, 1, None, GQA_MIN_SPLIT_KEYS), MAX_SPLITS);
        // ... so their partials (2 heads x 256 x 16) are merged inside `__gqa`; the global
        // layers' (16 x 512 over 64 splits) by the separate `__gqa_merge` launch
        use super::super::decode::gqa_fused_merge_fits;
        for cap in [100, 1024, 4096, 32768, 131072] {
            let s = decode_splits(cap, 8, Some(1024), GQA_MIN_SPLIT_KEYS);
            assert!(gqa_fused_merge_fits(2, 256, s), "{cap}: {s}");
        }
        assert!(!gqa_fused_merge_fits(
            16,
            512,
            decode_splits(4240, 1, None, GQA_MIN_SPLIT_KEYS)
        ));
        for cap in [1, 63, 64, 1000, 4096, 131072] {
            for hkv in [1, 2, 4, 8, 16] {
                for w in [None, Some(1), Some(512), Some(1 << 20)] {
                    let s = decode_splits(cap, hkv, w, MIN_SPLIT_KEYS);
                    assert!((1..=MAX_SPLITS).contains(&s));
                }
            }
        }
    }

    #[test]
    fn head_split_bounds_the_work_per_block() {
        assert_eq!(decode_head_split(4, 128), 1); // Qwen3-8B
        assert_eq!(decode_head_split(8, 128), 1); // Qwen3-30B-A3B
        assert_eq!(decode_head_split(2, 256), 1); // Gemma sliding layers
        assert_eq!(decode_head_split(16, 512), 8); // Gemma 4 global layers
        assert_eq!(decode_head_split(16, 128), 2);
        assert_eq!(decode_head_split(16, 16), 2); // at most 8 heads per block
        assert_eq!(decode_head_split(6, 256), 2);
        assert_eq!(decode_head_split(3, 512), 3);
        assert_eq!(decode_head_split(1, 512), 1);
        for g in 1..=16 {
            for d in [16, 32, 64, 128, 256, 512] {
                let s = decode_head_split(g, d);
                assert!(g % s == 0 && s <= MAX_HEAD_SPLIT && g / s <= MAX_DECODE_BLOCK_HEADS);
            }
        }
    }

    fn params(hq: usize, hkv: usize, d: usize) -> AttnParams {
        AttnParams {
            n_heads: hq,
            n_kv_heads: hkv,
            head_dim: d,
            scale: 0.1,
            window: None,
            softcap: None,
        }
    }

    #[test]
    fn attention_validation() {
        let s = shape(2, 128, 100);
        let ok =
            |p: &AttnParams, n: usize, max_pos: usize| check_attention_shape(&s, n, max_pos, p);
        assert!(ok(&params(8, 2, 128), 4, 99).is_ok());
        assert!(ok(&params(8, 2, 128), 4, 100).is_err()); // past capacity
        assert!(ok(&params(8, 2, 128), 0, 0).is_err()); // no rows
        assert!(ok(&params(8, 4, 128), 1, 0).is_err()); // kv heads differ from the cache
        assert!(ok(&params(8, 2, 64), 1, 0).is_err()); // head dim differs
        assert!(ok(&params(7, 2, 128), 1, 0).is_err()); // not a multiple
        assert!(ok(&params(34, 2, 128), 1, 0).is_err()); // group 17
        let mut p = params(8, 2, 128);
        p.softcap = Some(0.0);
        assert!(ok(&p, 1, 0).is_err());
        p.softcap = Some(30.0);
        p.window = Some(0);
        assert!(ok(&p, 1, 0).is_err());
        p.window = Some(512);
        assert!(ok(&p, 1, 0).is_ok());
    }

    #[test]
    fn position_ranges() {
        assert!(check_positions_shape(&shape(1, 64, 10), 0, 10).is_ok());
        assert!(check_positions_shape(&shape(1, 64, 10), 9, 1).is_ok());
        assert!(check_positions_shape(&shape(1, 64, 10), 9, 2).is_err());
        assert!(check_positions_shape(&shape(1, 64, 10), usize::MAX, 2).is_err());
    }
}
