//! Block formats repacked for the GPU decode GEMV (`q8_0r`, `q4_0r`, `q4_kr`, `q6_kr`): the same
//! bytes as the GGUF rows, reordered within each row so that the blocks' quant bodies sit
//! together (16-byte aligned) and their heads (scales) follow them.
//!
//! A GGUF row of `k` elements is `k / E` blocks, each a head (`Q4_0`/`Q8_0`: the f16 scale;
//! `Q4_K`: d, dmin and the 12 bytes of 6-bit scales and mins) then a body (the quants), or for
//! `Q6_K` a body (`ql`, `qh`) then a head (16 int8 scales, f16 d). Its repacked form has the
//! same length: the `k / E` bodies in order, then the `k / E` heads. A warp
//! then reads whole bodies with aligned, coalesced 16-byte loads instead of staging unaligned
//! blocks through shared memory. Rows stay as many bytes apart as in the file, so row slices,
//! chunks and embedding lookups address the matrix as before. Rows repack only when both the row
//! and its head region start 16-byte aligned ([`Split::fits`]: `k % 256 == 0` for the first
//! three, `k % 2048 == 0` for Q6_K's 210-byte blocks).

use crate::kernels::Quant;

/// How a block splits into head and body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Elements per block.
    pub elems: usize,
    /// Head bytes (first in the GGUF block, after the bodies when repacked).
    pub head: usize,
    /// Body bytes.
    pub body: usize,
    /// Whether the head ends the GGUF block (Q6_K) instead of starting it.
    pub head_last: bool,
}

/// Q4_0: f16 d, 16 nibble bytes.
pub const Q4_0: Split = Split {
    elems: 32,
    head: 2,
    body: 16,
    head_last: false,
};
/// Q8_0: f16 d, 32 int8.
pub const Q8_0: Split = Split {
    elems: 32,
    head: 2,
    body: 32,
    head_last: false,
};
/// Q4_K: f16 d, f16 dmin, 12 bytes of scales / mins; 128 nibble bytes.
pub const Q4_K: Split = Split {
    elems: 256,
    head: 16,
    body: 128,
    head_last: false,
};
/// Q6_K: 128 bytes of low nibbles and 64 of high bit pairs; 16 int8 scales, f16 d.
pub const Q6_K: Split = Split {
    elems: 256,
    head: 18,
    body: 192,
    head_last: true,
};

impl Split {
    fn block(self) -> usize {
        self.head + self.body
    }

    /// Whether rows of `cols` elements can be stored repacked: whole blocks, rows and the head
    /// region 16-byte aligned.
    pub fn fits(self, cols: usize) -> bool {
        cols > 0 && cols % self.elems == 0 && {
            let nb = cols / self.elems;
            (nb * self.block()) % 16 == 0 && (nb * self.body) % 16 == 0
        }
    }

    fn row_bytes(self, src: usize, dst: usize, cols: usize) -> Result<usize, String> {
        if cols == 0 || cols % self.elems != 0 {
            return Err(format!(
                "{cols} columns is not whole {}-element blocks",
                self.elems
            ));
        }
        let row = cols / self.elems * self.block();
        if src % row != 0 || dst != src {
            return Err(format!(
                "{src} source bytes into {dst}: need whole rows of {row} bytes, same length"
            ));
        }
        Ok(row)
    }

    /// Whole GGUF rows of `cols` elements (`src`) into their repacked form (`dst`, same length).
    /// Large inputs are split by rows over the available cores.
    pub fn repack(self, src: &[u8], cols: usize, dst: &mut [u8]) -> Result<(), String> {
        let row = self.row_bytes(src.len(), dst.len(), cols)?;
        let rows = |s: &[u8], d: &mut [u8]| match (self.head, self.body, self.head_last) {
            (2, 16, false) => rows_to::<2, 16, false>(s, d, row),
            (2, 32, false) => rows_to::<2, 32, false>(s, d, row),
            (16, 128, false) => rows_to::<16, 128, false>(s, d, row),
            (18, 192, true) => rows_to::<18, 192, true>(s, d, row),
            _ => rows_to_any(s, d, row, self),
        };
        par_rows(src, dst, row, rows);
        Ok(())
    }

    /// The inverse of [`Split::repack`].
    pub fn unpack(self, src: &[u8], cols: usize, dst: &mut [u8]) -> Result<(), String> {
        let row = self.row_bytes(src.len(), dst.len(), cols)?;
        let nb = cols / self.elems;
        let (h, b) = (self.head, self.body);
        for (s, d) in src.chunks_exact(row).zip(dst.chunks_exact_mut(row)) {
            let (bodies, heads) = s.split_at(nb * b);
            for (i, blk) in d.chunks_exact_mut(self.block()).enumerate() {
                let (hd, bd) = self.parts_mut(blk);
                hd.copy_from_slice(&heads[h * i..h * (i + 1)]);
                bd.copy_from_slice(&bodies[b * i..b * (i + 1)]);
            }
        }
        Ok(())
    }

    /// A GGUF block's (head, body).
    fn parts(self, blk: &[u8]) -> (&[u8], &[u8]) {
        if self.head_last {
            let (b, h) = blk.split_at(self.body);
            (h, b)
        } else {
            blk.split_at(self.head)
        }
    }

    /// [`Split::parts`], mutable.
    fn parts_mut(self, blk: &mut [u8]) -> (&mut [u8], &mut [u8]) {
        if self.head_last {
            let (b, h) = blk.split_at_mut(self.body);
            (h, b)
        } else {
            blk.split_at_mut(self.head)
        }
    }

    /// [`Split::repack`] into a new buffer.
    pub fn repacked(self, src: &[u8], cols: usize) -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; src.len()];
        self.repack(src, cols, &mut out)?;
        Ok(out)
    }
}

/// Rows of `row` bytes, blocks of head `H` + body `B` bytes (the head last in the GGUF block
/// when `LAST`: Q6_K): bodies first, then heads (fixed sizes, so each copy is a few moves).
fn rows_to<const H: usize, const B: usize, const LAST: bool>(
    src: &[u8],
    dst: &mut [u8],
    row: usize,
) {
    let nb = row / (H + B);
    for (s, d) in src.chunks_exact(row).zip(dst.chunks_exact_mut(row)) {
        let (bodies, heads) = d.split_at_mut(nb * B);
        let blocks = s.chunks_exact(H + B);
        for ((blk, body), head) in blocks
            .zip(bodies.chunks_exact_mut(B))
            .zip(heads.chunks_exact_mut(H))
        {
            let (h, b) = if LAST {
                let (b, h) = blk.split_at(B);
                (h, b)
            } else {
                blk.split_at(H)
            };
            head.copy_from_slice(h);
            body.copy_from_slice(b);
        }
    }
}

/// [`rows_to`] for any block split.
fn rows_to_any(src: &[u8], dst: &mut [u8], row: usize, split: Split) {
    let (h, b) = (split.head, split.body);
    let nb = row / (h + b);
    for (s, d) in src.chunks_exact(row).zip(dst.chunks_exact_mut(row)) {
        let (bodies, heads) = d.split_at_mut(nb * b);
        for (i, blk) in s.chunks_exact(h + b).enumerate() {
            let (hd, bd) = split.parts(blk);
            heads[h * i..h * (i + 1)].copy_from_slice(hd);
            bodies[b * i..b * (i + 1)].copy_from_slice(bd);
        }
    }
}

/// `f` over whole rows of `src` / `dst`, split by rows over the available cores from 4 MB up.
fn par_rows(src: &[u8], dst: &mut [u8], row: usize, f: impl Fn(&[u8], &mut [u8]) + Sync) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(16);
    let rows = src.len() / row.max(1);
    if threads < 2 || src.len() < (4 << 20) || rows < 2 {
        f(src, dst);
        return;
    }
    let per = rows.div_ceil(threads) * row;
    std::thread::scope(|sc| {
        for (s, d) in src.chunks(per).zip(dst.chunks_mut(per)) {
            let f = &f;
            sc.spawn(move || f(s, d));
        }
    });
}

/// The repacked kernel format of a GGUF kernel format and how its blocks split (None: the
/// format is not repacked).
pub fn repacked_of(q: Quant) -> Option<(Quant, Split)> {
    Some(match q {
        Quant::Q8_0 => (Quant::Q8_0R, Q8_0),
        Quant::Q4_0 => (Quant::Q4_0R, Q4_0),
        Quant::Q4K => (Quant::Q4KR, Q4_K),
        Quant::Q6K => (Quant::Q6KR, Q6_K),
        _ => return None,
    })
}

/// The GGUF kernel format a repacked format comes from, and its split (None: not repacked).
pub fn source_of(q: Quant) -> Option<(Quant, Split)> {
    Some(match q {
        Quant::Q8_0R => (Quant::Q8_0, Q8_0),
        Quant::Q4_0R => (Quant::Q4_0, Q4_0),
        Quant::Q4KR => (Quant::Q4K, Q4_K),
        Quant::Q6KR => (Quant::Q6K, Q6_K),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_round_trip() {
        for (s, cols) in [(Q4_0, 256usize), (Q8_0, 512), (Q4_K, 768), (Q6_K, 2048)] {
            let rows = 3;
            let nb = cols / s.elems;
            let row = nb * s.block();
            let src: Vec<u8> = (0..rows * row).map(|i| (i * 7 + 3) as u8).collect();
            let r = s.repacked(&src, cols).unwrap();
            // row 2, block 1: body at body * 1 of the row, head at body * nb + head * 1
            let blk = &src[2 * row + s.block()..2 * row + 2 * s.block()];
            let (head, body) = if s.head_last {
                (&blk[s.body..], &blk[..s.body])
            } else {
                (&blk[..s.head], &blk[s.head..])
            };
            let at = 2 * row;
            assert_eq!(&r[at + s.body..at + 2 * s.body], body);
            let h0 = at + nb * s.body + s.head;
            assert_eq!(&r[h0..h0 + s.head], head);
            let mut back = vec![0u8; src.len()];
            s.unpack(&r, cols, &mut back).unwrap();
            assert_eq!(back, src);
        }
    }

    #[test]
    fn fixed_generic_and_threaded_paths_agree() {
        for (s, cols) in [(Q4_0, 4096usize), (Q8_0, 4096), (Q4_K, 4096), (Q6_K, 4096)] {
            let row = cols / s.elems * s.block();
            let rows = (6 << 20) / row; // over the threading threshold
            let src: Vec<u8> = (0..rows * row).map(|i| (i * 31 + i / 7) as u8).collect();
            let r = s.repacked(&src, cols).unwrap();
            let mut generic = vec![0u8; src.len()];
            rows_to_any(&src, &mut generic, row, s);
            assert_eq!(r, generic, "{s:?}");
            let mut back = vec![0u8; src.len()];
            s.unpack(&r, cols, &mut back).unwrap();
            assert_eq!(back, src, "{s:?}");
        }
    }

    #[test]
    fn fits_and_rejects() {
        assert!(Q4_0.repack(&[0u8; 20], 32, &mut [0u8; 20]).is_err());
        assert!(Q4_0.repack(&[0u8; 18], 33, &mut [0u8; 18]).is_err());
        assert!(Q4_0.repack(&[0u8; 18], 32, &mut [0u8; 17]).is_err());
        for s in [Q4_0, Q8_0, Q4_K] {
            assert!(
                s.fits(4096) && s.fits(3840) && s.fits(12288) && !s.fits(0),
                "{s:?}"
            );
        }
        // 640 = 20 Q4_0 blocks: 360-byte rows are not 16-byte aligned
        assert!(!Q4_0.fits(640) && !Q8_0.fits(640) && !Q4_K.fits(640));
        assert!(Q4_K.fits(256) && !Q4_0.fits(32));
        // Q6_K: 210-byte blocks, rows 16-byte aligned from 8 blocks (2048 values)
        assert!(Q6_K.fits(2048) && Q6_K.fits(4096) && Q6_K.fits(12288));
        assert!(!Q6_K.fits(3840) && !Q6_K.fits(1024) && !Q6_K.fits(256));
        for q in [Quant::Q8_0, Quant::Q4_0, Quant::Q4K, Quant::Q6K] {
            let (r, s) = repacked_of(q).unwrap();
            assert_eq!(source_of(r), Some((q, s)));
        }
    }
}
