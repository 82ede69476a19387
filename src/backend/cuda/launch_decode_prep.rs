//! The arguments of ops/attn_decode's `__mma_prep` entry: decode attention that first makes its
//! own input the way ops/attn_prep does (q / k norms, RoPE, the new K / V row into the cache),
//! so a decode step runs one kernel where it ran two.

use cudarc::driver::{LaunchArgs, PushKernelArg};

use super::error::CudaError;
use super::launch_attn::KvLayout;
use super::launch_fused::{prep_factors, AttnPrepBufs, AttnPrepLaunch};
use crate::ops::RopeLayout;

/// What `__mma_prep` needs besides the attention's own arguments: attn_prep's launch, the
/// cache's layout and buffers (`bufs.q` is the attention's q, unnormed; `bufs.q_out` and
/// `bufs.pos` are unused: the rotated q stays on chip, the position is the attention's q_pos).
#[derive(Debug, Clone, Copy)]
pub struct DecodePrep<'a> {
    pub launch: &'a AttnPrepLaunch,
    pub layout: &'a KvLayout,
    pub bufs: &'a AttnPrepBufs,
}

/// The checked kernel arguments of a [`DecodePrep`], in the entry's order after `xds`.
pub(crate) struct PrepArgs {
    kin: u64,
    vin: u64,
    freq_factors: u64,
    weights: [u64; 3],
    modes: [i32; 3],
    eps: f32,
    rot_dims: i32,
    freq_base_dims: i32,
    rope_layout: i32,
    theta: f32,
    capacity: i32,
    ring_pages: i32,
}

fn invalid(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

impl DecodePrep<'_> {
    /// Checks the prep inputs against the attention launch (one sequence of `hkv` KV heads of
    /// `d`, cache elements of `kvb` bytes, `max_pages` block-table columns, `window`) and
    /// returns the kernel arguments. The entry writes the new row at page q_pos / page_size
    /// modulo ring_pages and reads it through the block table: full caches with the identity
    /// table only (the caller's contract, as kv.rs builds them).
    pub(crate) fn args(
        &self,
        op: &'static str,
        d: usize,
        kvb: usize,
        hkv: usize,
        max_pages: usize,
        window: usize,
    ) -> Result<PrepArgs, CudaError> {
        let (l, p, b) = (self.layout, self.launch, self.bufs);
        if l.head_dim != d || l.elem_bytes != kvb || l.hkv != hkv {
            return Err(invalid(
                op,
                format!("prep layout {l:?} for {hkv} KV heads x {d} of {kvb}-byte elements"),
            ));
        }
        if window != 0 || l.ring_pages != l.pages() || l.pages() != max_pages {
            return Err(invalid(
                op,
                format!(
                    "prep needs a full cache (window {window}, layout {l:?}, {max_pages} pages)"
                ),
            ));
        }
        if p.rows != 1
            || p.rot_dims % 2 != 0
            || p.rot_dims > d
            || p.freq_base_dims == 0
            || b.k.len() < hkv * d
            || b.v.len() < hkv * d
        {
            return Err(invalid(
                op,
                format!(
                    "prep of {} rows, rot_dims {} of {d}, freq_base_dims {}, k {} v {} values",
                    p.rows,
                    p.rot_dims,
                    p.freq_base_dims,
                    b.k.len(),
                    b.v.len()
                ),
            ));
        }
        let [(qm, qw), (km, kw), (vm, vw)] = prep_factors(op, p, b, d)?;
        let int = |what: &str, v: usize| {
            i32::try_from(v).map_err(|_| invalid(op, format!("{what} {v} exceeds i32")))
        };
        Ok(PrepArgs {
            kin: b.k.raw(),
            vin: b.v.raw(),
            freq_factors: b.freq_factors.map_or(0, |f| f.raw()),
            weights: [qw, kw, vw],
            modes: [qm, km, vm],
            eps: p.eps,
            rot_dims: int("rot_dims", p.rot_dims)?,
            freq_base_dims: int("freq_base_dims", p.freq_base_dims)?,
            rope_layout: match p.layout {
                RopeLayout::Neox => 0,
                RopeLayout::Interleaved => 1,
            },
            theta: p.theta,
            capacity: int("capacity", l.capacity)?,
            ring_pages: int("ring_pages", l.ring_pages)?,
        })
    }
}

impl PrepArgs {
    /// Pushes the arguments (kin, vin, freq_factors, qw, kw, vw, q_mode, k_mode, v_mode, eps,
    /// rot_dims, freq_base_dims, rope_layout, theta, capacity, ring_pages) after the
    /// attention's own (an FP8 row's scales go to the attention's k_scales / v_scales).
    pub(crate) fn push<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(&self.kin)
            .arg(&self.vin)
            .arg(&self.freq_factors)
            .arg(&self.weights[0])
            .arg(&self.weights[1])
            .arg(&self.weights[2])
            .arg(&self.modes[0])
            .arg(&self.modes[1])
            .arg(&self.modes[2])
            .arg(&self.eps)
            .arg(&self.rot_dims)
            .arg(&self.freq_base_dims)
            .arg(&self.rope_layout)
            .arg(&self.theta)
            .arg(&self.capacity)
            .arg(&self.ring_pages);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::buf::DevPtr;
    use crate::backend::cuda::NormWeightPtr;

    fn ptr<T>(len: usize) -> DevPtr<T> {
        // SAFETY: never dereferenced: `args` only checks lengths and packs addresses
        unsafe { DevPtr::from_raw(0x1000, len) }
    }

    /// One sequence of Qwen3-8B's attention input: 8 KV heads of 128, a full FP8 cache of 4096
    /// positions in pages of 16 (256 pages), q/k norms, NeoX RoPE over the whole head.
    fn valid() -> (AttnPrepLaunch, KvLayout, AttnPrepBufs) {
        let launch = AttnPrepLaunch {
            rows: 1,
            n_heads: 32,
            rot_dims: 128,
            freq_base_dims: 128,
            layout: RopeLayout::Neox,
            theta: 1e6,
            eps: 1e-6,
        };
        let layout = KvLayout {
            hkv: 8,
            head_dim: 128,
            page_size: 16,
            capacity: 4096,
            ring_pages: 256,
            elem_bytes: 1,
        };
        let bufs = AttnPrepBufs {
            q: ptr(32 * 128),
            k: ptr(8 * 128),
            v: ptr(8 * 128),
            pos: DevPtr::null(),
            freq_factors: None,
            q_norm: Some(NormWeightPtr::Plain(ptr(128))),
            k_norm: Some(NormWeightPtr::Plain(ptr(128))),
            v_norm: None,
            q_out: DevPtr::null(),
            k_cache: ptr(4096 * 8 * 128),
            v_cache: ptr(4096 * 8 * 128),
            scales: crate::backend::cuda::launch_attn::KvScales::none(),
        };
        (launch, layout, bufs)
    }

    /// `args` for the attention side (d 128, FP8, 8 KV heads, 256 pages, no window) after `f`.
    fn check(f: impl FnOnce(&mut AttnPrepLaunch, &mut KvLayout, &mut AttnPrepBufs)) -> bool {
        let (mut l, mut k, mut b) = valid();
        f(&mut l, &mut k, &mut b);
        let p = DecodePrep {
            launch: &l,
            layout: &k,
            bufs: &b,
        };
        p.args("t", 128, 1, 8, 256, 0).is_ok()
    }

    #[test]
    fn prep_arguments_are_checked() {
        assert!(check(|_, _, _| {}));
        // the cache: a ring, another head dim or element size
        assert!(!check(|_, k, _| k.ring_pages = 16));
        assert!(!check(|_, k, _| k.head_dim = 64));
        assert!(!check(|_, k, _| k.elem_bytes = 2));
        // more than one row, odd or too many rotated dims, no frequency base
        assert!(!check(|l, _, _| l.rows = 2));
        assert!(!check(|l, _, _| l.rot_dims = 127));
        assert!(!check(|l, _, _| l.rot_dims = 256));
        assert!(!check(|l, _, _| l.freq_base_dims = 0));
        // short inputs, too few freq factors, a norm weight of the wrong length, bad scales
        assert!(!check(|_, _, b| b.k = ptr(8 * 128 - 1)));
        assert!(!check(|_, _, b| b.freq_factors = Some(ptr(63))));
        assert!(check(|_, _, b| b.freq_factors = Some(ptr(64))));
        assert!(!check(
            |_, _, b| b.q_norm = Some(NormWeightPtr::OnePlus(ptr(64)))
        ));
        // a window on the attention side
        let (l, k, b) = valid();
        let p = DecodePrep {
            launch: &l,
            layout: &k,
            bufs: &b,
        };
        assert!(p.args("t", 128, 1, 8, 256, 1024).is_err());
        assert!(p.args("t", 128, 1, 8, 128, 0).is_err()); // block table of another width
        assert!(p.args("t", 128, 1, 4, 256, 0).is_err()); // KV heads differ
    }
}
