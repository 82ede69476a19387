//! Q4_0 repacked for the GPU decode GEMV (`q4_0r`): the same bytes as the GGUF rows, reordered
//! within each row so that the 16-byte nibble blocks sit together (16-byte aligned) and the f16
//! scales follow them.
//!
//! A GGUF Q4_0 row of `k` elements is `k / 32` blocks of 18 bytes (`d: f16`, 16 nibble bytes).
//! Its repacked form has the same length: the `k / 32` nibble runs of 16 bytes, in order, then
//! the `k / 32` scales. A warp then reads whole blocks with aligned, coalesced 16-byte loads
//! instead of staging unaligned 18-byte blocks through shared memory. Rows stay `k / 32 * 18`
//! bytes apart, so row slices, chunks and embedding lookups address the matrix as before; a row
//! starts 16-byte aligned when `k` is a multiple of 256 ([`Q4_0R_COLS`]).

/// Rows repack only when their length is a multiple of this (18 * k / 32 bytes a multiple of 16).
pub const Q4_0R_COLS: usize = 256;

/// Bytes per Q4_0 block and per its nibbles.
const BLOCK: usize = 18;
const NIBBLES: usize = 16;

/// Whether rows of `cols` elements can be stored repacked.
pub fn q4_0r_fits(cols: usize) -> bool {
    cols > 0 && cols % Q4_0R_COLS == 0
}

fn check(src: usize, dst: usize, cols: usize) -> Result<usize, String> {
    if cols == 0 || cols % 32 != 0 {
        return Err(format!("{cols} columns is not whole Q4_0 blocks"));
    }
    let row = cols / 32 * BLOCK;
    if src % row != 0 || dst != src {
        return Err(format!(
            "{src} source bytes into {dst}: need whole rows of {row} bytes, same length"
        ));
    }
    Ok(row)
}

/// Whole GGUF Q4_0 rows of `cols` elements (`src`) into their repacked form (`dst`, same length).
pub fn q4_0_to_q4_0r(src: &[u8], cols: usize, dst: &mut [u8]) -> Result<(), String> {
    let row = check(src.len(), dst.len(), cols)?;
    let nb = cols / 32;
    for (s, d) in src.chunks_exact(row).zip(dst.chunks_exact_mut(row)) {
        let (nib, scales) = d.split_at_mut(nb * NIBBLES);
        for (b, blk) in s.chunks_exact(BLOCK).enumerate() {
            scales[2 * b..2 * b + 2].copy_from_slice(&blk[..2]);
            nib[NIBBLES * b..NIBBLES * (b + 1)].copy_from_slice(&blk[2..]);
        }
    }
    Ok(())
}

/// The inverse of [`q4_0_to_q4_0r`].
pub fn q4_0r_to_q4_0(src: &[u8], cols: usize, dst: &mut [u8]) -> Result<(), String> {
    let row = check(src.len(), dst.len(), cols)?;
    let nb = cols / 32;
    for (s, d) in src.chunks_exact(row).zip(dst.chunks_exact_mut(row)) {
        let (nib, scales) = s.split_at(nb * NIBBLES);
        for (b, blk) in d.chunks_exact_mut(BLOCK).enumerate() {
            blk[..2].copy_from_slice(&scales[2 * b..2 * b + 2]);
            blk[2..].copy_from_slice(&nib[NIBBLES * b..NIBBLES * (b + 1)]);
        }
    }
    Ok(())
}

/// [`q4_0_to_q4_0r`] into a new buffer.
pub fn repacked_q4_0r(src: &[u8], cols: usize) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; src.len()];
    q4_0_to_q4_0r(src, cols, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_round_trip() {
        let cols = 256;
        let rows = 3;
        let src: Vec<u8> = (0..rows * cols / 32 * 18)
            .map(|i| (i * 7 + 3) as u8)
            .collect();
        let r = repacked_q4_0r(&src, cols).unwrap();
        let nb = cols / 32;
        let row = nb * 18;
        // row 2, block 5: nibbles at 16 * 5 of the row, scale at 16 * nb + 2 * 5
        let blk = &src[2 * row + 5 * 18..2 * row + 6 * 18];
        assert_eq!(&r[2 * row + 80..2 * row + 96], &blk[2..]);
        assert_eq!(
            &r[2 * row + 16 * nb + 10..2 * row + 16 * nb + 12],
            &blk[..2]
        );
        let mut back = vec![0u8; src.len()];
        q4_0r_to_q4_0(&r, cols, &mut back).unwrap();
        assert_eq!(back, src);
    }

    #[test]
    fn rejects_partial_rows() {
        assert!(q4_0_to_q4_0r(&[0u8; 20], 32, &mut [0u8; 20]).is_err());
        assert!(q4_0_to_q4_0r(&[0u8; 18], 33, &mut [0u8; 18]).is_err());
        assert!(q4_0_to_q4_0r(&[0u8; 18], 32, &mut [0u8; 17]).is_err());
        assert!(q4_0r_fits(4096) && q4_0r_fits(3840) && !q4_0r_fits(640) && !q4_0r_fits(0));
    }
}
