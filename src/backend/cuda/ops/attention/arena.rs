//! The KV arena: the caches of many sequences in one allocation per cache layout, so that a step
//! of several sequences writes every sequence's K/V and runs every sequence's decode attention
//! of a layer in one launch each (`attn_prep` with each row's first page, `attn_decode` with a
//! block table row per sequence over the arena's pages).
//!
//! An arena has a number of sequence slots ([`KvArena::new`]) and is laid out at the first
//! request (`Runtime::kv_caches`: one sequence's layers' shapes in order): per distinct layout
//! (KV heads, head dim, capacity, ring) one K and one V buffer (and an FP8 cache's row scales)
//! of `slots * per_seq * ring_pages` pages, `per_seq` being how many of a sequence's layers have
//! that layout. Slot s's cache of ordinal o (its o-th layer of the layout) is pages
//! `[(s * per_seq + o) * ring_pages, ..)`: a layer's caches of every sequence sit at one ordinal,
//! `per_seq * ring_pages` pages apart, so one base pointer (the ordinal's first page) and a page
//! offset per sequence address all of them ([`ArenaKind::seq_page0`]).
//!
//! A cache of a slot is an ordinary [`GpuKvCache`] to every one-sequence op (its pointers are the
//! slot's pages; its block table, counters and length its own); the slot returns to the arena
//! when the last cache of the sequence is dropped. A request the arena cannot serve (other
//! shapes, every slot taken) gets `None`: the caller allocates caches of its own.

use std::sync::{Arc, Mutex};

use super::launch::{KvLayout, KvScales};
use crate::backend::cuda::runtime::buf::{DevBuf, DevPtr, Pool};
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::types::KvType;
use crate::backend::KvShape;

/// Most head shares per KV head whose decode counters a slot keeps (as `kv.rs`).
const COUNTERS_PER_KV_HEAD: usize = 16;

fn bad(detail: String) -> CudaError {
    CudaError::Invalid {
        op: "kv_arena",
        detail,
    }
}

/// Sequence slots of one allocation per cache layout (see the module docs).
pub struct KvArena {
    slots: usize,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for KvArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KvArena({} slots)", self.slots)
    }
}

#[derive(Default)]
struct Inner {
    /// The layout, made at the first request.
    plan: Option<Arc<Plan>>,
    /// Free sequence slots (popped from the end: the lowest first).
    free: Vec<usize>,
}

/// The arena's layout: what shapes one sequence asks for, and where each one's caches live.
pub struct Plan {
    shapes: Vec<KvShape>,
    kv_type: KvType,
    slots: usize,
    kinds: Vec<ArenaKind>,
    /// Per requested shape: (kind, ordinal within the kind).
    place: Vec<(usize, usize)>,
}

/// The caches of one layout, for every slot.
pub struct ArenaKind {
    pub layout: KvLayout,
    pub kv_type: KvType,
    /// Caches of this layout per sequence.
    pub per_seq: usize,
    k: DevBuf,
    v: DevBuf,
    /// FP8: K row scales of every page, then V's (f16); None for f16.
    scales: Option<DevBuf>,
    /// The batched decode launch's arrival counters, u32 `[slots][hkv][16]` (zero between launches).
    counters: DevBuf,
    /// The last batched decode block table made, by the slots it was made for (every layer of
    /// the kind and step reads the same one).
    table: Kept<Vec<usize>>,
    /// The last rows' first pages made (`row_pages`), by the (slot, rows) of each sequence.
    rows: Kept<Vec<(usize, usize)>>,
}

/// A device buffer made for a key, kept until another key asks (what every layer of a step
/// reads alike).
type Kept<K> = Mutex<Option<(K, DevBuf)>>;

/// The buffer `kept` holds for `key`, else `make()`'s values uploaded and kept.
fn kept_upload<K: PartialEq>(
    kept: &Kept<K>,
    pool: &Arc<Pool>,
    key: K,
    make: impl FnOnce() -> Result<Vec<i32>, CudaError>,
) -> Result<DevPtr<i32>, CudaError> {
    let mut g = kept.lock().map_err(|_| bad("lock poisoned".into()))?;
    if let Some((k, buf)) = g.as_ref() {
        if *k == key {
            return Ok(buf.ptr());
        }
    }
    let buf = pool.upload(&make()?)?;
    let ptr = buf.ptr();
    *g = Some((key, buf));
    Ok(ptr)
}

/// Pages of one slot's cache of a layout, and of all the slot's caches of that layout.
fn seq_pages(kind: &ArenaKind) -> usize {
    kind.per_seq * kind.layout.ring_pages
}

impl ArenaKind {
    /// Bytes of one page of K (or V).
    fn page_bytes(&self) -> usize {
        self.layout.hkv * self.layout.page_size * self.layout.head_dim * self.layout.elem_bytes
    }

    /// Cache rows (one position of one KV head) per page: what an FP8 cache keeps scales for.
    fn page_rows(&self) -> usize {
        self.layout.hkv * self.layout.page_size
    }

    fn total_pages(&self, slots: usize) -> usize {
        slots * seq_pages(self)
    }

    /// The page offset of `slot`'s caches from the base of any ordinal ([`Self::base`]).
    pub fn seq_page0(&self, slot: usize) -> usize {
        slot * seq_pages(self)
    }

    /// K and V from the first page of `ordinal`'s cache of slot 0 to the end of the arena, with
    /// their row scales: what a launch over several slots' caches of that ordinal addresses
    /// (slot s's pages start [`Self::seq_page0`] pages further).
    pub fn base(&self, ordinal: usize, slots: usize) -> Option<(DevPtr<u8>, DevPtr<u8>, KvScales)> {
        let first = ordinal * self.layout.ring_pages;
        let pages = self.total_pages(slots).checked_sub(first)?;
        let (pb, pr) = (self.page_bytes(), self.page_rows());
        let k = self.k.u8().slice(first * pb, pages * pb)?;
        let v = self.v.u8().slice(first * pb, pages * pb)?;
        let scales = match &self.scales {
            None => KvScales::none(),
            Some(s) => {
                let all = s.ptr::<u16>();
                let rows = self.total_pages(slots) * pr;
                KvScales {
                    k: all.slice(first * pr, pages * pr)?,
                    v: all.slice(rows + first * pr, pages * pr)?,
                }
            }
        };
        Some((k, v, scales))
    }

    /// The decode launch's counters for `batch` sequences of `per_seq_counters` each.
    pub fn counters(&self, need: usize) -> Option<DevPtr<u32>> {
        self.counters.ptr::<u32>().slice(0, need)
    }

    /// The block table of a batched decode launch over `slots` (in the step's order), i32
    /// `[slots.len()][pages]`: sequence b's logical page p is page `seq_page0(slots[b]) +
    /// p % ring_pages` past the base. Made once per set of slots and kept: every layer of the
    /// kind reads the same one.
    pub fn table(&self, pool: &Arc<Pool>, slots: &[usize]) -> Result<DevPtr<i32>, CudaError> {
        kept_upload(&self.table, pool, slots.to_vec(), || {
            decode_table(&self.layout, self.per_seq, slots)
        })
    }
}

impl ArenaKind {
    /// Each row's first page for a step whose sequence j holds `seqs[j].1` rows in slot
    /// `seqs[j].0` (i32 per row: what `attn_prep`'s `page0` reads), and the largest. Made once
    /// per step shape and kept: every layer of the kind reads the same one.
    pub fn row_pages(
        &self,
        pool: &Arc<Pool>,
        seqs: &[(usize, usize)],
    ) -> Result<(DevPtr<i32>, usize), CudaError> {
        let max = seqs
            .iter()
            .map(|&(s, _)| self.seq_page0(s))
            .max()
            .unwrap_or(0);
        let ptr = kept_upload(&self.rows, pool, seqs.to_vec(), || {
            let mut rows = Vec::new();
            for &(slot, n) in seqs {
                let page = i32::try_from(self.seq_page0(slot))
                    .map_err(|_| bad(format!("slot {slot}'s pages exceed i32")))?;
                rows.extend(std::iter::repeat_n(page, n));
            }
            Ok(rows)
        })?;
        Ok((ptr, max))
    }
}

/// The rows of a batched decode block table (see [`ArenaKind::table`]).
pub fn decode_table(
    layout: &KvLayout,
    per_seq: usize,
    slots: &[usize],
) -> Result<Vec<i32>, CudaError> {
    let (pages, ring) = (layout.pages(), layout.ring_pages.max(1));
    let mut rows = Vec::with_capacity(slots.len() * pages);
    for &s in slots {
        let page0 = s * per_seq * ring;
        for p in 0..pages {
            let page = i32::try_from(page0 + p % ring)
                .map_err(|_| bad(format!("page {} exceeds i32", page0 + p % ring)))?;
            rows.push(page);
        }
    }
    Ok(rows)
}

/// The distinct layouts of one sequence's caches, each with how many of them have it; and per
/// cache, its (layout index, ordinal).
type Placement = (Vec<(KvLayout, usize)>, Vec<(usize, usize)>);

/// Where the caches of `layouts` (one sequence's, in order) go.
pub fn place(layouts: &[KvLayout]) -> Placement {
    let mut kinds: Vec<(KvLayout, usize)> = Vec::new();
    let mut place = Vec::with_capacity(layouts.len());
    for &l in layouts {
        let at = match kinds.iter().position(|(k, _)| *k == l) {
            Some(i) => i,
            None => {
                kinds.push((l, 0));
                kinds.len() - 1
            }
        };
        place.push((at, kinds[at].1));
        kinds[at].1 += 1;
    }
    (kinds, place)
}

impl Plan {
    pub fn kind(&self, i: usize) -> &ArenaKind {
        &self.kinds[i]
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Lay out `slots` sequences of `shapes` (allocating and zeroing every buffer).
    fn new(
        pool: &Arc<Pool>,
        (shapes, layouts): (&[KvShape], &[KvLayout]),
        kv_type: KvType,
        slots: usize,
    ) -> Result<Plan, CudaError> {
        let (layouts, place) = place(layouts);
        let mut kinds = Vec::with_capacity(layouts.len());
        for (layout, per_seq) in layouts {
            let pages = slots * per_seq * layout.ring_pages;
            let pb = layout.hkv * layout.page_size * layout.head_dim * layout.elem_bytes;
            let bytes = pages
                .checked_mul(pb)
                .ok_or_else(|| bad(format!("{pages} pages of {pb} bytes")))?;
            let k = pool.alloc_persistent(bytes)?;
            let v = pool.alloc_persistent(bytes)?;
            k.fill_bytes(0)?;
            v.fill_bytes(0)?;
            let scales = match kv_type {
                KvType::Fp8E4m3 => {
                    let s = pool.alloc_persistent(2 * pages * layout.hkv * layout.page_size * 2)?;
                    s.fill_bytes(0)?;
                    Some(s)
                }
                _ => None,
            };
            let counters = pool.alloc_persistent(slots * layout.hkv * COUNTERS_PER_KV_HEAD * 4)?;
            counters.fill_bytes(0)?;
            kinds.push(ArenaKind {
                layout,
                kv_type,
                per_seq,
                k,
                v,
                scales,
                counters,
                table: Mutex::new(None),
                rows: Mutex::new(None),
            });
        }
        Ok(Plan {
            shapes: shapes.to_vec(),
            kv_type,
            slots,
            kinds,
            place,
        })
    }

    /// Zero slot `s`'s pages (every kind: K, V and scales), as a new cache is.
    fn zero_slot(&self, pool: &Arc<Pool>, s: usize) -> Result<(), CudaError> {
        use crate::backend::cuda::runtime::buf::memset;
        for kind in &self.kinds {
            let (pb, pr) = (kind.page_bytes(), kind.page_rows());
            let (p0, n) = (kind.seq_page0(s), seq_pages(kind));
            let span = |b: &DevBuf, unit: usize, at: usize| {
                b.u8()
                    .slice(at * unit, n * unit)
                    .ok_or_else(|| bad(format!("slot {s} past the arena")))
            };
            memset(pool.stream(), span(&kind.k, pb, p0)?, 0)?;
            memset(pool.stream(), span(&kind.v, pb, p0)?, 0)?;
            if let Some(sc) = &kind.scales {
                // f16 scales: 2 bytes per row; K's then V's
                let rows = kind.total_pages(self.slots) * pr;
                memset(pool.stream(), span(sc, 2 * pr, p0)?, 0)?;
                let v = sc
                    .u8()
                    .slice(2 * (rows + p0 * pr), 2 * n * pr)
                    .ok_or_else(|| bad(format!("slot {s} past the arena's scales")))?;
                memset(pool.stream(), v, 0)?;
            }
        }
        Ok(())
    }
}

/// A sequence's hold on a slot: the slot returns to the arena when the last of its caches goes.
pub struct SlotLease {
    arena: Arc<KvArena>,
    plan: Arc<Plan>,
    slot: usize,
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        if let Ok(mut g) = self.arena.inner.lock() {
            g.free.push(self.slot);
        }
    }
}

impl std::fmt::Debug for SlotLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SlotLease({})", self.slot)
    }
}

/// One cache's place in the arena.
#[derive(Debug, Clone)]
pub struct CacheSlot {
    lease: Arc<SlotLease>,
    kind: usize,
    ordinal: usize,
}

impl CacheSlot {
    pub fn slot(&self) -> usize {
        self.lease.slot
    }
    pub fn plan(&self) -> &Arc<Plan> {
        &self.lease.plan
    }
    pub fn kind_index(&self) -> usize {
        self.kind
    }
    pub fn kind(&self) -> &ArenaKind {
        self.lease.plan.kind(self.kind)
    }
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Whether `other` is the same layer's cache of another sequence of the same arena (so one
    /// launch over the ordinal's base addresses both).
    pub fn same_layer(&self, other: &CacheSlot) -> bool {
        Arc::ptr_eq(&self.lease.plan, &other.lease.plan)
            && self.kind == other.kind
            && self.ordinal == other.ordinal
    }

    /// This cache's own K, V and scales (its slot's pages of its ordinal).
    pub fn memory(&self) -> Result<(DevPtr<u8>, DevPtr<u8>, KvScales), CudaError> {
        let kind = self.kind();
        let slots = self.lease.plan.slots;
        let (k, v, s) = kind
            .base(self.ordinal, slots)
            .ok_or_else(|| bad("a cache past the arena".into()))?;
        let (pb, pr) = (kind.page_bytes(), kind.page_rows());
        let (p0, n) = (kind.seq_page0(self.lease.slot), kind.layout.ring_pages);
        let own = |p: DevPtr<u8>| {
            p.slice(p0 * pb, n * pb)
                .ok_or_else(|| bad(format!("slot {} past the arena", self.lease.slot)))
        };
        let rows = |p: DevPtr<u16>| -> Result<DevPtr<u16>, CudaError> {
            if p.is_empty() {
                return Ok(p);
            }
            p.slice(p0 * pr, n * pr)
                .ok_or_else(|| bad(format!("slot {} past the arena's scales", self.lease.slot)))
        };
        Ok((
            own(k)?,
            own(v)?,
            KvScales {
                k: rows(s.k)?,
                v: rows(s.v)?,
            },
        ))
    }
}

impl KvArena {
    /// An arena of `slots` sequences, laid out at the first request.
    pub fn new(slots: usize) -> Arc<KvArena> {
        Arc::new(KvArena {
            slots,
            inner: Mutex::new(Inner {
                plan: None,
                free: (0..slots).rev().collect(),
            }),
        })
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    /// A free slot for a sequence of `shapes` (whose caches have `layouts`) and each shape's
    /// place in it (laying the arena out for `shapes` at the first request, the slot zeroed);
    /// None where the arena holds other shapes or every slot is taken.
    pub fn lease(
        self: &Arc<Self>,
        pool: &Arc<Pool>,
        (shapes, layouts): (&[KvShape], &[KvLayout]),
        kv_type: KvType,
    ) -> Result<Option<Vec<CacheSlot>>, CudaError> {
        if shapes.is_empty() || shapes.len() != layouts.len() || self.slots == 0 {
            return Ok(None);
        }
        let mut g = self
            .inner
            .lock()
            .map_err(|_| bad("arena lock poisoned".into()))?;
        let plan = match &g.plan {
            Some(p) if p.shapes == shapes && p.kv_type == kv_type => p.clone(),
            Some(_) => return Ok(None),
            None => {
                let p = Arc::new(Plan::new(pool, (shapes, layouts), kv_type, self.slots)?);
                g.plan = Some(p.clone());
                p
            }
        };
        let Some(slot) = g.free.pop() else {
            return Ok(None);
        };
        drop(g);
        let lease = Arc::new(SlotLease {
            arena: self.clone(),
            plan: plan.clone(),
            slot,
        });
        plan.zero_slot(pool, slot)?;
        Ok(Some(
            plan.place
                .iter()
                .map(|&(kind, ordinal)| CacheSlot {
                    lease: lease.clone(),
                    kind,
                    ordinal,
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paged layout of `capacity` positions in pages of 64, a ring of `ring` pages (as
    /// kv.rs makes it).
    fn layout(hkv: usize, d: usize, capacity: usize, ring: usize) -> KvLayout {
        KvLayout {
            hkv,
            head_dim: d,
            page_size: 64,
            capacity,
            ring_pages: ring,
            elem_bytes: 2,
        }
    }

    #[test]
    fn layers_of_one_layout_share_a_kind_in_order() {
        // Gemma-like: sliding, sliding, global, sliding
        let (sliding, global) = (layout(2, 256, 1000, 8), layout(2, 256, 1000, 16));
        let (kinds, place) = place(&[sliding, sliding, global, sliding]);
        assert_eq!(kinds, vec![(sliding, 3), (global, 1)]);
        assert_eq!(place, vec![(0, 0), (0, 1), (1, 0), (0, 2)]);
    }

    #[test]
    fn decode_tables_offset_each_sequence_by_its_slot() {
        // 3 layers of one layout per sequence, 130 positions: 3 pages, full (ring = pages)
        let l = layout(1, 64, 130, 3);
        let t = decode_table(&l, 3, &[2, 0]).unwrap();
        assert_eq!(t, vec![18, 19, 20, 0, 1, 2]);
        // a ring of 2 pages over 5 logical pages
        let r = layout(1, 64, 300, 2);
        assert_eq!(r.pages(), 5);
        let t = decode_table(&r, 1, &[1]).unwrap();
        assert_eq!(t, vec![2, 3, 2, 3, 2]);
    }
}
