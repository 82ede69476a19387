//! MoE prefill grouped on the device: no host round trip, a fixed number of launches per layer,
//! every launch shape a function of `n` alone (so the step can be captured in a CUDA graph).
//!
//! 1. `moe_group` (one block): the (token, slot) pairs counted per expert, offsets, a permutation
//!    `perm` that groups them by expert, and a table of row tiles (`{expert, row0, row1}`, at most
//!    `BM` sorted rows of one expert each; unused entries have expert -1);
//! 2. `cast_bf16` of x (the A operand);
//! 3. `moe_gemm` (gate + up with the GLU fused): ONE launch over all experts, grid
//!    `(max_tiles, ff / 32)`, each block finds its expert and rows in the tile table (or exits),
//!    gathers its activation rows through `perm`, dequantises the expert's weight tiles from the
//!    GGUF bank in its loader and writes `h = bf16(act(gate) * up)` in sorted order;
//! 4. `moe_gemm__down`: ONE launch, `d[pair] = W_down[e] h` written back in pair order;
//! 5. `moe_combine`: `out[t] = sum_j w[t][j] d[t * k + j]` (slots in order, as the CPU).
//!
//! `max_tiles` = [`grouped_max_tiles`] bounds the used tiles for any routing. Results do not
//! depend on the order of pairs within an expert (every output row is computed on its own), so
//! they are the same run to run.

use crate::kernels::Entry;
use std::sync::Arc;

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::launch::expert_bytes;
use super::launch::MoeDims;
use crate::backend::cuda::runtime::buf::{DevBuf, DevPtr, Pool};
use crate::backend::cuda::runtime::error::{drv, CudaError};
use crate::backend::cuda::runtime::types::GpuWeight;
use crate::backend::cuda::CudaDevice;
use crate::backend::Activation;
use crate::kernels::{BatchBucket, HeadDim, KernelSpec, Op, Quant};

/// Weight formats the grouped GEMM (`moe_gemm`) reads.
pub const GROUPED_FORMATS: [Quant; 4] = [Quant::Q4_0, Quant::Q8_0, Quant::Q4K, Quant::Q6K];

/// Columns of `h` one gate/up block computes (its 64 weight rows: 32 gate + 32 up).
pub const GLU_COLS: usize = 32;
/// Output columns of one down block.
pub const DOWN_COLS: usize = 64;

fn invalid(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

fn int(op: &'static str, what: &str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| invalid(op, format!("{what} = {v} exceeds i32")))
}

/// An upper bound on the row tiles of `bm` rows that `pairs` pairs spread over `e` experts need:
/// `sum_e ceil(c_e / bm) <= (pairs + nz * (bm - 1)) / bm` with `nz <= min(e, pairs)` non-empty
/// experts (each contributes at most `bm - 1` rows of padding).
pub fn grouped_max_tiles(pairs: usize, e: usize, bm: usize) -> usize {
    let bm = bm.max(1);
    (pairs + e.min(pairs) * (bm - 1)) / bm
}

/// The host model of `moe_group` for `ids` over `e` experts: offsets (`e + 1`: the first sorted
/// position of each expert, then the number of pairs with an id in `0..e`) and the tile table
/// padded to `max_tiles` entries (`[expert, row0, row1, 0]` in expert order, unused entries
/// `[-1, 0, 0, 0]`; tiles past `max_tiles` are dropped).
pub fn group_tiles(
    ids: &[i32],
    e: usize,
    bm: usize,
    max_tiles: usize,
) -> (Vec<usize>, Vec<[i32; 4]>) {
    let bm = bm.max(1);
    let mut counts = vec![0usize; e];
    for &id in ids {
        if let Some(c) = usize::try_from(id).ok().and_then(|i| counts.get_mut(i)) {
            *c += 1;
        }
    }
    let mut offs = Vec::with_capacity(e + 1);
    let mut tiles = Vec::new();
    let mut at = 0usize;
    for (ex, &c) in counts.iter().enumerate() {
        offs.push(at);
        let mut r = at;
        while r < at + c {
            let end = (r + bm).min(at + c);
            tiles.push([ex as i32, r as i32, end as i32, 0]);
            r = end;
        }
        at += c;
    }
    offs.push(at);
    tiles.resize(max_tiles, [-1, 0, 0, 0]);
    (offs, tiles)
}

/// Can the banks run through the grouped GEMM: gate and up of one format, each bank in a
/// `moe_gemm` format without block scales, `ff` a multiple of [`GLU_COLS`], whole blocks per row.
pub fn grouped_ready(q: [Quant; 3], d: &MoeDims) -> bool {
    let fmt = |q: Quant| GROUPED_FORMATS.contains(&q);
    q[0] == q[1]
        && fmt(q[0])
        && fmt(q[2])
        && d.ff % GLU_COLS == 0
        && expert_bytes("moe", q[0], d.ff, d.hidden)
            .is_ok_and(|b| b % 16 == 0 || q[0] != Quant::Q4K)
        && expert_bytes("moe", q[2], d.out, d.ff).is_ok_and(|b| b % 16 == 0 || q[2] != Quant::Q4K)
        && d.hidden % 32 == 0
        && d.ff % 32 == 0
}

/// Validate a `moe_group` launch (lengths in elements; `tiles` in i32, 4 per tile).
#[allow(clippy::too_many_arguments)]
pub fn check_group(
    pairs: usize,
    e: usize,
    bm: usize,
    max_tiles: usize,
    max_experts: usize,
    ids: usize,
    perm: usize,
    offs: usize,
    tiles: usize,
) -> Result<(), CudaError> {
    const OP: &str = "moe_group";
    if e == 0 || e > max_experts || bm == 0 {
        return Err(invalid(
            OP,
            format!("{e} experts (1..={max_experts}), bm {bm}"),
        ));
    }
    let need_t = grouped_max_tiles(pairs, e, bm);
    if max_tiles < need_t {
        return Err(invalid(
            OP,
            format!("{max_tiles} tiles, {pairs} pairs over {e} experts may need {need_t}"),
        ));
    }
    if ids < pairs || perm < pairs || offs < e + 1 || tiles / 4 < max_tiles {
        return Err(invalid(
            OP,
            format!(
                "ids {ids} / perm {perm} / offs {offs} / tiles {tiles} for {pairs} pairs, {e} experts, {max_tiles} tiles"
            ),
        ));
    }
    int(OP, "pairs", pairs)?;
    int(OP, "max_tiles", max_tiles)?;
    int(OP, "pairs + bm", pairs + bm)?;
    Ok(())
}

/// One grouped GEMM launch over the tiles of `moe_group`.
#[derive(Debug, Clone, Copy)]
pub struct MoeGemmArgs {
    /// bf16 activations `[rows, k]`: x (gate/up: pair `p` reads row `p / top_k`) or h (down:
    /// sorted row `i` reads row `i`).
    pub a: DevPtr<u16>,
    /// Pair at each sorted position (`pairs` values, from `moe_group`).
    pub perm: DevPtr<i32>,
    /// The tile table (`4 * max_tiles` i32, from `moe_group` with the instance's `bm`).
    pub tiles: DevPtr<i32>,
    pub max_tiles: usize,
    pub pairs: usize,
    /// Slots per token (gate/up); the down launch reads sorted rows (`top_k` ignored).
    pub top_k: usize,
    pub n_experts: usize,
    /// Output columns (ff for gate/up, the model width for down).
    pub n: usize,
    /// Inner dimension (hidden for gate/up, ff for down).
    pub k: usize,
}

/// Validate a `moe_gemm` launch of format `q`: `glu` (gate/up into bf16 `out_len` values) or
/// down (f32); `banks` the byte lengths and addresses of the banks. Returns the bytes of one
/// expert matrix.
pub fn check_moe_gemm(
    q: Quant,
    a: &MoeGemmArgs,
    glu: bool,
    banks: &[(usize, u64)],
    out_len: usize,
) -> Result<usize, CudaError> {
    const OP: &str = "moe_gemm";
    if !GROUPED_FORMATS.contains(&q) {
        return Err(invalid(OP, format!("no grouped GEMM for {q}")));
    }
    let eb = expert_bytes(OP, q, a.n, a.k)?;
    if a.k % 32 != 0 || (q == Quant::Q4K && eb % 16 != 0) {
        return Err(invalid(
            OP,
            format!("k = {} / expert of {eb} bytes for {q}", a.k),
        ));
    }
    if a.pairs == 0 || a.n_experts == 0 || a.top_k == 0 || a.max_tiles == 0 {
        return Err(invalid(
            OP,
            format!(
                "pairs {} / experts {} / top_k {} / tiles {}",
                a.pairs, a.n_experts, a.top_k, a.max_tiles
            ),
        ));
    }
    if glu && a.n % GLU_COLS != 0 {
        return Err(invalid(
            OP,
            format!("ff = {} is not a multiple of {GLU_COLS}", a.n),
        ));
    }
    let bank = eb
        .checked_mul(a.n_experts)
        .ok_or_else(|| invalid(OP, "bank size overflows".into()))?;
    for (i, &(len, addr)) in banks.iter().enumerate() {
        if len < bank || addr % 16 != 0 {
            return Err(invalid(
                OP,
                format!("bank {i}: {len} bytes at {addr:#x} (need {bank}, 16-byte aligned)"),
            ));
        }
    }
    let a_rows = if glu {
        a.pairs.div_ceil(a.top_k)
    } else {
        a.pairs
    };
    let outs = a.pairs.checked_mul(a.n);
    let ins = a_rows.checked_mul(a.k);
    match (ins, outs) {
        (Some(i), Some(o))
            if a.a.len() >= i
                && a.a.raw() % 16 == 0
                && out_len >= o
                && a.perm.len() >= a.pairs
                && a.tiles.len() / 4 >= a.max_tiles => {}
        _ => {
            return Err(invalid(
                OP,
                format!(
                "a {} (need {a_rows} x {}) / perm {} / tiles {} / out {out_len} for {} pairs x {}",
                a.a.len(),
                a.k,
                a.perm.len(),
                a.tiles.len(),
                a.pairs,
                a.n
            ),
            ))
        }
    }
    let cols = if glu {
        a.n / GLU_COLS
    } else {
        a.n.div_ceil(DOWN_COLS)
    };
    if cols > 65_535 || a.max_tiles >= 1 << 31 {
        return Err(invalid(
            OP,
            format!("grid {} x {cols} out of range", a.max_tiles),
        ));
    }
    int(OP, "n", a.n)?;
    int(OP, "k", a.k)?;
    int(OP, "top_k", a.top_k)?;
    int(OP, "pairs * n", outs.unwrap_or(usize::MAX))?;
    Ok(eb)
}

fn expect(spec: &KernelSpec, op: Op, name: &'static str) -> Result<(), CudaError> {
    if spec.key.op == op {
        Ok(())
    } else {
        Err(invalid(
            name,
            format!("instance {} is not a {name} kernel", spec.name),
        ))
    }
}

/// The activation code of `moe_gemm` (0 silu, 1 gelu_tanh).
fn act_code(act: Activation) -> i32 {
    match act {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
    }
}

impl CudaDevice {
    /// Group `pairs` pairs by expert (`moe_group`): `perm` `[pairs]`, `offs` `[e + 1]`, `tiles`
    /// `[max_tiles][4]` for row tiles of `bm` rows.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_group(
        &self,
        spec: &'static KernelSpec,
        ids: DevPtr<i32>,
        perm: DevPtr<i32>,
        offs: DevPtr<i32>,
        tiles: DevPtr<i32>,
        pairs: usize,
        e: usize,
        bm: usize,
        max_tiles: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "moe_group";
        expect(spec, Op::MoeGroup, OP)?;
        let max_e = spec.param_u32("max_experts").unwrap_or(256) as usize;
        check_group(
            pairs,
            e,
            bm,
            max_tiles,
            max_e,
            ids.len(),
            perm.len(),
            offs.len(),
            tiles.len(),
        )?;
        if tiles.raw() % 16 != 0 {
            return Err(invalid(OP, "tile table not 16-byte aligned".into()));
        }
        let (pi, ei, bi, ti) = (pairs as i32, e as i32, bm as i32, max_tiles as i32);
        let (ip, pp, op, tp) = (ids.raw(), perm.raw(), offs.raw(), tiles.raw());
        let f = self.function(spec)?;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&ip)
            .arg(&pp)
            .arg(&op)
            .arg(&tp)
            .arg(&pi)
            .arg(&ei)
            .arg(&bi)
            .arg(&ti);
        // SAFETY: matches (const int* ids, int* perm, int* offs, int4* tiles, int pairs, int E,
        // int bm, int max_tiles), one block of 1024 threads; ids/perm hold `pairs` values, offs
        // e + 1, tiles 4 * max_tiles (16-byte aligned), max_tiles bounds the used tiles and
        // E <= the instance's max_experts (check_group).
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// Gate and up over all experts with the GLU fused (`moe_gemm`): `h` bf16 `[pairs, ff]` in
    /// sorted order, `a.a` = x bf16 `[n, hidden]`.
    pub fn moe_gemm_glu(
        &self,
        spec: &'static KernelSpec,
        a: &MoeGemmArgs,
        gate: DevPtr<u8>,
        up: DevPtr<u8>,
        h: DevPtr<u16>,
        act: Activation,
    ) -> Result<(), CudaError> {
        const OP: &str = "moe_gemm";
        expect(spec, Op::MoeGemm, OP)?;
        let banks = [(gate.len(), gate.raw()), (up.len(), up.raw())];
        let eb = check_moe_gemm(spec.key.quant, a, true, &banks, h.len())? as i64;
        let f = self.function(spec)?;
        let cfg = LaunchConfig {
            grid_dim: (a.max_tiles as u32, (a.n / GLU_COLS) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ap, pp, tp, gp, upp, hp) = (
            a.a.raw(),
            a.perm.raw(),
            a.tiles.raw(),
            gate.raw(),
            up.raw(),
            h.raw(),
        );
        let (ki, ffi, kk, ac) = (a.top_k as i32, a.n as i32, a.k as i32, act_code(act));
        let mut b = self.stream().launch_builder(&f);
        b.arg(&ap)
            .arg(&pp)
            .arg(&ki)
            .arg(&tp)
            .arg(&gp)
            .arg(&upp)
            .arg(&eb)
            .arg(&hp)
            .arg(&ffi)
            .arg(&kk)
            .arg(&ac);
        // SAFETY: matches (const u16* A, const int* perm, int top_k, const int4* tiles,
        // const u8* Wg, const u8* Wu, long long expert_bytes, u16* H, int ff, int K, int act),
        // 128 threads, grid (max_tiles, ff / 32); A holds ceil(pairs / top_k) rows of K bf16,
        // both banks n_experts experts of expert_bytes (16-byte aligned), H pairs * ff values
        // (check_moe_gemm); perm and tiles come from moe_group over the same pairs and experts
        // (sorted rows < pairs, perm a permutation of 0..pairs, experts < n_experts).
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// The down projection over all experts (`moe_gemm__down`): `d` f32 `[pairs, n]` in pair
    /// order, `a.a` = h bf16 `[pairs, ff]` in sorted order.
    pub fn moe_gemm_down(
        &self,
        spec: &'static KernelSpec,
        a: &MoeGemmArgs,
        bank: DevPtr<u8>,
        d: DevPtr<f32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "moe_gemm";
        expect(spec, Op::MoeGemm, OP)?;
        let eb = check_moe_gemm(
            spec.key.quant,
            a,
            false,
            &[(bank.len(), bank.raw())],
            d.len(),
        )? as i64;
        let f = self.function_entry(spec, Entry::Down)?;
        let cfg = LaunchConfig {
            grid_dim: (a.max_tiles as u32, a.n.div_ceil(DOWN_COLS) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ap, pp, tp, wp, dp) = (a.a.raw(), a.perm.raw(), a.tiles.raw(), bank.raw(), d.raw());
        let (ni, ki) = (a.n as i32, a.k as i32);
        let mut b = self.stream().launch_builder(&f);
        b.arg(&ap)
            .arg(&pp)
            .arg(&tp)
            .arg(&wp)
            .arg(&eb)
            .arg(&dp)
            .arg(&ni)
            .arg(&ki);
        // SAFETY: matches (const u16* A, const int* perm, const int4* tiles, const u8* W,
        // long long expert_bytes, float* D, int N, int K), 128 threads, grid (max_tiles,
        // ceil(N / 64)); A holds pairs rows of K bf16, the bank n_experts experts, D pairs * N
        // floats (check_moe_gemm); perm / tiles from moe_group (rows < pairs, pairs < pairs).
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}__down", spec.name)))?;
        Ok(())
    }

    /// The whole grouped prefill (module docs); `ids`, `wts` from `moe_route`. The caller checked
    /// [`grouped_ready`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_prefill_grouped(
        &self,
        pool: &Arc<Pool>,
        x: DevPtr<f32>,
        d: &MoeDims,
        ids: DevPtr<i32>,
        wts: DevPtr<f32>,
        banks: [&GpuWeight; 3],
        act: Activation,
    ) -> Result<DevBuf, CudaError> {
        let (n, e, k, pairs) = (d.n, d.experts, d.top_k, d.pairs());
        let [gate, up, down] = banks;
        let spec = |op: Op, q: Quant| self.resolve(op, q, HeadDim::Any, BatchBucket::Any);
        let gu_spec = spec(Op::MoeGemm, gate.quant)?;
        let dn_spec = spec(Op::MoeGemm, down.quant)?;
        let bm = gu_spec.param_u32("bm").unwrap_or(64) as usize;
        if dn_spec.param_u32("bm").unwrap_or(64) as usize != bm {
            return Err(invalid(
                "moe",
                format!("{} and {} tile rows differ", gu_spec.name, dn_spec.name),
            ));
        }
        let max_tiles = grouped_max_tiles(pairs, e, bm);
        let alloc = |bytes: usize| pool.alloc(bytes.max(16));
        let ptr = |b: &DevBuf, len: usize| -> Result<DevPtr<u8>, CudaError> {
            b.u8()
                .slice(0, len)
                .ok_or_else(|| invalid("moe", format!("pool returned a short buffer for {len}")))
        };

        // 1. grouping
        let perm_b = alloc(pairs * 4)?;
        let offs_b = alloc((e + 1) * 4)?;
        let tiles_b = alloc(max_tiles * 16)?;
        let perm = ptr(&perm_b, pairs * 4)?.cast::<i32>();
        let tiles = ptr(&tiles_b, max_tiles * 16)?.cast::<i32>();
        self.moe_group(
            spec(Op::MoeGroup, Quant::F32)?,
            ids,
            perm,
            ptr(&offs_b, (e + 1) * 4)?.cast::<i32>(),
            tiles,
            pairs,
            e,
            bm,
            max_tiles,
        )?;

        // 2. bf16 activations
        let xb_b = alloc(n * d.hidden * 2)?;
        let xb = ptr(&xb_b, n * d.hidden * 2)?.cast::<u16>();
        let cast = self.kern(Op::CastBf16, Quant::F32, BatchBucket::Any)?;
        let xs = x
            .slice(0, n * d.hidden)
            .ok_or_else(|| invalid("moe", "x too short".into()))?;
        self.cast_bf16_ptr(&cast, xs, xb)?;

        // 3. gate + up + GLU
        let bank = |w: &GpuWeight, rows: usize, cols: usize| -> Result<DevPtr<u8>, CudaError> {
            let per = expert_bytes("moe", w.quant, rows, cols)?;
            w.data
                .u8()
                .slice(0, per * e)
                .ok_or_else(|| invalid("moe", format!("bank shorter than {e} experts")))
        };
        let h_b = alloc(pairs * d.ff * 2)?;
        let h = ptr(&h_b, pairs * d.ff * 2)?.cast::<u16>();
        let args = MoeGemmArgs {
            a: xb,
            perm,
            tiles,
            max_tiles,
            pairs,
            top_k: k,
            n_experts: e,
            n: d.ff,
            k: d.hidden,
        };
        self.moe_gemm_glu(
            gu_spec,
            &args,
            bank(gate, d.ff, d.hidden)?,
            bank(up, d.ff, d.hidden)?,
            h,
            act,
        )?;

        // 4. down, rows back in pair order
        let dd_b = alloc(pairs * d.out * 4)?;
        let dd = ptr(&dd_b, pairs * d.out * 4)?.cast::<f32>();
        let dargs = MoeGemmArgs {
            a: h,
            n: d.out,
            k: d.ff,
            ..args
        };
        self.moe_gemm_down(dn_spec, &dargs, bank(down, d.out, d.ff)?, dd)?;

        // 5. weighted sum over slots
        let out_b = alloc(n * d.out * 4)?;
        let out = ptr(&out_b, n * d.out * 4)?.cast::<f32>();
        self.moe_combine(spec(Op::MoeCombine, Quant::F32)?, dd, wts, out, n, d.out, k)?;
        Ok(out_b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p<T>(addr: u64, len: usize) -> DevPtr<T> {
        // SAFETY: never dereferenced (validation only).
        unsafe { DevPtr::from_raw(addr, len) }
    }

    /// The bound holds for every way of spreading the pairs (brute force over small cases),
    /// and is reached.
    #[test]
    fn max_tiles_bounds_every_routing() {
        fn tiles(counts: &[usize], bm: usize) -> usize {
            counts.iter().map(|c| c.div_ceil(bm)).sum()
        }
        // all compositions of `pairs` into `e` parts, recursively
        fn worst(pairs: usize, e: usize, bm: usize, acc: &mut Vec<usize>, best: &mut usize) {
            if e == 1 {
                acc.push(pairs);
                *best = (*best).max(tiles(acc, bm));
                acc.pop();
                return;
            }
            for c in 0..=pairs {
                acc.push(c);
                worst(pairs - c, e - 1, bm, acc, best);
                acc.pop();
            }
        }
        for bm in [1usize, 2, 3, 4, 8] {
            for e in 1..=5usize {
                for pairs in 0..=12usize {
                    let mut best = 0;
                    worst(pairs, e, bm, &mut Vec::new(), &mut best);
                    let b = grouped_max_tiles(pairs, e, bm);
                    assert!(b >= best, "pairs {pairs} e {e} bm {bm}: {b} < {best}");
                    assert!(
                        b <= best + 1,
                        "pairs {pairs} e {e} bm {bm}: bound {b} far above {best}"
                    );
                }
            }
        }
        // Qwen3-30B-A3B at pp512: 4096 pairs over 128 experts, 64-row tiles
        assert_eq!(grouped_max_tiles(4096, 128, 64), 190);
        assert_eq!(grouped_max_tiles(0, 128, 64), 0);
        assert_eq!(grouped_max_tiles(5, 128, 64), 5);
    }

    #[test]
    fn host_group_model() {
        // expert 0 empty, 1 with one pair, 2 with more than a tile (bm = 4), 3 exactly a tile;
        // ids outside 0..4 belong to no expert
        let ids = [2, 1, 2, 3, 2, 3, -1, 2, 3, 2, 3, 4];
        let t = grouped_max_tiles(ids.len(), 4, 4);
        let (offs, tiles) = group_tiles(&ids, 4, 4, t);
        assert_eq!(offs, vec![0, 0, 1, 6, 10]);
        assert_eq!(
            tiles[..4],
            [[1, 0, 1, 0], [2, 1, 5, 0], [2, 5, 6, 0], [3, 6, 10, 0]]
        );
        assert!(tiles[4..].iter().all(|v| *v == [-1, 0, 0, 0]));
        assert_eq!(tiles.len(), t);
        assert!(t >= 4);
        // no pairs: no tiles
        let (o, tl) = group_tiles(&[], 3, 64, 0);
        assert_eq!(o, vec![0, 0, 0, 0]);
        assert!(tl.is_empty());
    }

    #[test]
    fn readiness() {
        let d = MoeDims {
            n: 512,
            experts: 128,
            top_k: 8,
            hidden: 2048,
            ff: 768,
            out: 2048,
        };
        assert!(grouped_ready([Quant::Q4K, Quant::Q4K, Quant::Q6K], &d));
        assert!(grouped_ready([Quant::Q4_0, Quant::Q4_0, Quant::Q8_0], &d));
        // gate and up of different formats, formats without an instance
        assert!(!grouped_ready([Quant::Q4K, Quant::Q6K, Quant::Q6K], &d));
        assert!(!grouped_ready([Quant::Q5_0, Quant::Q5_0, Quant::Q6K], &d));
        assert!(!grouped_ready([Quant::Bf16, Quant::Bf16, Quant::Bf16], &d));
        // ff not a multiple of 32 columns
        let odd = MoeDims { ff: 48, ..d };
        assert!(!grouped_ready(
            [Quant::Q8_0, Quant::Q8_0, Quant::Q8_0],
            &odd
        ));
        let ok = MoeDims { ff: 96, ..d };
        assert!(grouped_ready([Quant::Q8_0, Quant::Q8_0, Quant::Q8_0], &ok));
    }

    #[test]
    fn group_validation() {
        let t = grouped_max_tiles(100, 16, 64);
        assert!(check_group(100, 16, 64, t, 256, 100, 100, 17, 4 * t).is_ok());
        assert!(check_group(100, 16, 64, t - 1, 256, 100, 100, 17, 4 * t).is_err());
        assert!(check_group(100, 16, 64, t, 256, 99, 100, 17, 4 * t).is_err());
        assert!(check_group(100, 16, 64, t, 256, 100, 99, 17, 4 * t).is_err());
        assert!(check_group(100, 16, 64, t, 256, 100, 100, 16, 4 * t).is_err());
        assert!(check_group(100, 16, 64, t, 256, 100, 100, 17, 4 * t - 1).is_err());
        assert!(check_group(100, 0, 64, t, 256, 100, 100, 17, 4 * t).is_err());
        assert!(check_group(100, 257, 64, 400, 256, 100, 100, 258, 1600).is_err());
        assert!(check_group(100, 16, 0, t, 256, 100, 100, 17, 4 * t).is_err());
    }

    #[test]
    fn gemm_validation() {
        let (e, ff, hid, pairs, k) = (4usize, 64usize, 256usize, 12usize, 2usize);
        let t = grouped_max_tiles(pairs, e, 64);
        let eb = ff * (hid / 256) * 144;
        let a = MoeGemmArgs {
            a: p(0x1000, (pairs / k) * hid),
            perm: p(0x2000, pairs),
            tiles: p(0x3000, 4 * t),
            max_tiles: t,
            pairs,
            top_k: k,
            n_experts: e,
            n: ff,
            k: hid,
        };
        let banks = [(e * eb, 0x10000u64), (e * eb, 0x20000u64)];
        assert_eq!(
            check_moe_gemm(Quant::Q4K, &a, true, &banks, pairs * ff).unwrap(),
            eb
        );
        // short output, short bank, unaligned bank, short activations, short perm / tiles
        assert!(check_moe_gemm(Quant::Q4K, &a, true, &banks, pairs * ff - 1).is_err());
        assert!(
            check_moe_gemm(Quant::Q4K, &a, true, &[(e * eb - 1, 0x10000)], pairs * ff).is_err()
        );
        assert!(check_moe_gemm(Quant::Q4K, &a, true, &[(e * eb, 0x10008)], pairs * ff).is_err());
        let short_a = MoeGemmArgs {
            a: p(0x1000, (pairs / k) * hid - 1),
            ..a
        };
        assert!(check_moe_gemm(Quant::Q4K, &short_a, true, &banks, pairs * ff).is_err());
        let short_p = MoeGemmArgs {
            perm: p(0x2000, pairs - 1),
            ..a
        };
        assert!(check_moe_gemm(Quant::Q4K, &short_p, true, &banks, pairs * ff).is_err());
        let short_t = MoeGemmArgs {
            tiles: p(0x3000, 4 * t - 1),
            ..a
        };
        assert!(check_moe_gemm(Quant::Q4K, &short_t, true, &banks, pairs * ff).is_err());
        // the down launch reads one row per pair
        assert!(check_moe_gemm(Quant::Q4K, &a, false, &banks, pairs * ff).is_err());
        let down = MoeGemmArgs {
            a: p(0x1000, pairs * hid),
            ..a
        };
        assert!(check_moe_gemm(Quant::Q4K, &down, false, &banks[..1], pairs * ff).is_ok());
        // formats: no f16 grouped GEMM; q4_k needs k in whole 256-blocks
        assert!(check_moe_gemm(Quant::F16, &a, true, &banks, pairs * ff).is_err());
        let k96 = MoeGemmArgs {
            k: 96,
            a: p(0x1000, pairs * 96),
            ..a
        };
        assert!(check_moe_gemm(Quant::Q4K, &k96, true, &banks, pairs * ff).is_err());
        let q8 = 64 * (96 / 32) * 34;
        assert!(check_moe_gemm(
            Quant::Q8_0,
            &k96,
            true,
            &[(e * q8, 0x10000), (e * q8, 0x20000)],
            pairs * ff
        )
        .is_ok());
        // gate/up output columns in whole 32-column tiles
        let ff48 = MoeGemmArgs { n: 48, ..k96 };
        let q8b = 48 * 3 * 34 * e;
        assert!(check_moe_gemm(
            Quant::Q8_0,
            &ff48,
            true,
            &[(q8b, 0x10000), (q8b, 0x20000)],
            pairs * 48
        )
        .is_err());
        assert!(check_moe_gemm(
            Quant::Q8_0,
            &MoeGemmArgs {
                a: p(0x1000, pairs * 96),
                ..ff48
            },
            false,
            &[(q8b, 0x10000)],
            pairs * 48
        )
        .is_ok());
    }
}
