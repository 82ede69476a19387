//! The blocks of a paged KV pool, kept on the host: which blocks are free, how many block tables
//! hold each one (so sequences that share a prompt prefix share its blocks, and a block returns
//! to the free list when its last holder lets go), and each sequence's block table.
//!
//! The memory the blocks index is the backend's (per attention layer, K and V of `blocks`
//! blocks of `block_size` positions); one block id addresses the same positions in every layer
//! of a sequence, as in vLLM. This is the bookkeeping a scheduler admits requests by and the
//! rows of a step's block table come from. Nothing here touches a device; every operation that
//! needs blocks either gets all it asked for or changes nothing.

/// A table entry whose block was released: positions there are no longer cached (a
/// sliding-window layer's blocks before its window, see [`BlockPool::release_before`]).
pub const HOLE: u32 = u32::MAX;

/// Why blocks could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("the KV pool has {free} free blocks, {need} are needed")]
    OutOfBlocks { need: usize, free: usize },
    #[error("position {pos} is in a released block")]
    Released { pos: usize },
    #[error("position {pos} is past the {blocks} blocks of the table")]
    Unreserved { pos: usize, blocks: usize },
}

/// The blocks one sequence's KV rows live in: position `p` is row `p % block_size` of block
/// `blocks()[p / block_size]`. Made, grown, shared and given back only through a
/// [`BlockPool`]; a table dropped without [`BlockPool::free`] keeps its blocks out of the pool.
#[derive(Debug, Default, PartialEq, Eq)]
#[must_use = "a block table holds pool blocks until BlockPool::free"]
pub struct BlockTable {
    blocks: Vec<u32>,
}

impl BlockTable {
    /// The block ids, [`HOLE`] for released ones.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }
    /// Blocks held (released ones not counted).
    pub fn held(&self) -> usize {
        self.blocks.iter().filter(|&&b| b != HOLE).count()
    }
}

/// Usage of a pool, for metrics and admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockStats {
    pub total: usize,
    pub free: usize,
    /// Blocks held by more than one table.
    pub shared: usize,
}

/// The free list and reference counts of `total` blocks of `block_size` positions.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    refs: Vec<u32>,
    /// Free block ids, the next one to hand out last (so the lowest ids go first).
    free: Vec<u32>,
}

impl BlockPool {
    /// A pool of `total` free blocks (`block_size >= 1`; `total` below [`HOLE`]).
    pub fn new(total: usize, block_size: usize) -> BlockPool {
        assert!(block_size > 0, "a block holds at least one position");
        assert!(total < HOLE as usize, "block ids are u32 below HOLE");
        BlockPool {
            block_size,
            refs: vec![0; total],
            free: (0..total as u32).rev().collect(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn total(&self) -> usize {
        self.refs.len()
    }
    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }
    pub fn stats(&self) -> BlockStats {
        BlockStats {
            total: self.total(),
            free: self.free.len(),
            shared: self.refs.iter().filter(|&&r| r > 1).count(),
        }
    }

    /// Blocks that hold `tokens` positions.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Blocks [`Self::reserve`] would take to grow `t` to `tokens` positions.
    pub fn needed(&self, t: &BlockTable, tokens: usize) -> usize {
        self.blocks_for(tokens).saturating_sub(t.blocks.len())
    }

    fn take(&mut self) -> u32 {
        let b = self.free.pop().expect("checked by the caller");
        debug_assert_eq!(self.refs[b as usize], 0);
        self.refs[b as usize] = 1;
        b
    }

    fn release(&mut self, b: u32) {
        if b == HOLE {
            return;
        }
        let r = &mut self.refs[b as usize];
        debug_assert!(*r > 0, "block {b} released more often than held");
        *r -= 1;
        if *r == 0 {
            self.free.push(b);
        }
    }

    /// Grow `t` to hold positions `0 .. tokens`: all the blocks it needs, or none and an error.
    pub fn reserve(&mut self, t: &mut BlockTable, tokens: usize) -> Result<(), BlockError> {
        let need = self.needed(t, tokens);
        if need > self.free.len() {
            return Err(BlockError::OutOfBlocks {
                need,
                free: self.free.len(),
            });
        }
        for _ in 0..need {
            let b = self.take();
            t.blocks.push(b);
        }
        Ok(())
    }

    /// Shrink `t` to positions `0 .. tokens` (a rewind): the blocks past them are released.
    pub fn truncate(&mut self, t: &mut BlockTable, tokens: usize) {
        let keep = self.blocks_for(tokens).min(t.blocks.len());
        for b in t.blocks.split_off(keep) {
            self.release(b);
        }
    }

    /// A new table sharing the blocks of positions `0 .. tokens` of `t` (a prompt prefix):
    /// each shared block is held once more. Writing into a shared block needs
    /// [`Self::make_writable`] first.
    pub fn fork(&mut self, t: &BlockTable, tokens: usize) -> BlockTable {
        let n = self.blocks_for(tokens).min(t.blocks.len());
        let blocks = t.blocks[..n].to_vec();
        for &b in &blocks {
            if b != HOLE {
                self.refs[b as usize] += 1;
            }
        }
        BlockTable { blocks }
    }

    /// Before writing position `pos` of `t`: where its block is shared, `t` gets a block of
    /// its own and the result is `(shared, own)`, whose rows the caller copies on the device
    /// before writing; None where `t` alone holds it.
    pub fn make_writable(
        &mut self,
        t: &mut BlockTable,
        pos: usize,
    ) -> Result<Option<(u32, u32)>, BlockError> {
        let i = pos / self.block_size;
        let b = *t.blocks.get(i).ok_or(BlockError::Unreserved {
            pos,
            blocks: t.blocks.len(),
        })?;
        if b == HOLE {
            return Err(BlockError::Released { pos });
        }
        if self.refs[b as usize] == 1 {
            return Ok(None);
        }
        if self.free.is_empty() {
            return Err(BlockError::OutOfBlocks { need: 1, free: 0 });
        }
        let own = self.take();
        self.release(b);
        t.blocks[i] = own;
        Ok(Some((b, own)))
    }

    /// Release the blocks of `t` that hold only positions below `pos` (a sliding-window
    /// layer's table once its window has passed them); their entries become [`HOLE`].
    pub fn release_before(&mut self, t: &mut BlockTable, pos: usize) {
        let n = (pos / self.block_size).min(t.blocks.len());
        for i in 0..n {
            let b = std::mem::replace(&mut t.blocks[i], HOLE);
            self.release(b);
        }
    }

    /// Give every block of `t` back.
    pub fn free(&mut self, t: BlockTable) {
        for b in t.blocks {
            self.release(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block is free or held as often as the live tables hold it.
    fn consistent(p: &BlockPool, tables: &[&BlockTable]) {
        let mut held = vec![0u32; p.total()];
        for t in tables {
            for &b in t.blocks() {
                if b != HOLE {
                    held[b as usize] += 1;
                }
            }
        }
        assert_eq!(held, p.refs);
        for b in 0..p.total() as u32 {
            assert_eq!(p.free.contains(&b), held[b as usize] == 0, "block {b}");
        }
    }

    #[test]
    fn reserve_is_all_or_nothing() {
        let mut p = BlockPool::new(4, 16);
        let mut a = BlockTable::default();
        p.reserve(&mut a, 17).unwrap();
        assert_eq!(a.blocks(), &[0, 1]);
        p.reserve(&mut a, 32).unwrap(); // still two blocks
        assert_eq!(a.held(), 2);
        let mut b = BlockTable::default();
        assert_eq!(
            p.reserve(&mut b, 48),
            Err(BlockError::OutOfBlocks { need: 3, free: 2 })
        );
        assert_eq!(b.held(), 0);
        assert_eq!(p.free_blocks(), 2);
        consistent(&p, &[&a, &b]);
        p.free(a);
        p.free(b);
        assert_eq!(p.free_blocks(), 4);
    }

    #[test]
    fn truncate_releases_the_tail() {
        let mut p = BlockPool::new(8, 4);
        let mut a = BlockTable::default();
        p.reserve(&mut a, 20).unwrap();
        p.truncate(&mut a, 9);
        assert_eq!(a.blocks(), &[0, 1, 2]);
        p.truncate(&mut a, 0);
        assert!(a.blocks().is_empty());
        assert_eq!(p.free_blocks(), 8);
        consistent(&p, &[&a]);
    }

    #[test]
    fn forks_share_until_written() {
        let mut p = BlockPool::new(6, 4);
        let mut a = BlockTable::default();
        p.reserve(&mut a, 10).unwrap(); // blocks 0 1 2, position 9 in block 2
        let mut b = p.fork(&a, 10);
        assert_eq!(b.blocks(), a.blocks());
        assert_eq!(p.stats().shared, 3);
        consistent(&p, &[&a, &b]);
        // b writes position 10: block 2 is shared, so b gets its own copy
        assert_eq!(p.make_writable(&mut b, 10).unwrap(), Some((2, 3)));
        assert_eq!(b.blocks(), &[0, 1, 3]);
        // a is now alone in block 2
        assert_eq!(p.make_writable(&mut a, 10).unwrap(), None);
        consistent(&p, &[&a, &b]);
        p.free(a);
        // b's prefix blocks survive a's end
        assert_eq!(p.free_blocks(), 6 - 3);
        consistent(&p, &[&b]);
        p.free(b);
        assert_eq!(
            p.stats(),
            BlockStats {
                total: 6,
                free: 6,
                shared: 0
            }
        );
    }

    #[test]
    fn a_fork_of_a_partial_prefix_takes_its_blocks_only() {
        let mut p = BlockPool::new(8, 4);
        let mut a = BlockTable::default();
        p.reserve(&mut a, 16).unwrap();
        let b = p.fork(&a, 5);
        assert_eq!(b.blocks(), &[0, 1]);
        consistent(&p, &[&a, &b]);
        p.free(a);
        p.free(b);
        assert_eq!(p.free_blocks(), 8);
    }

    #[test]
    fn writes_outside_the_table_are_errors() {
        let mut p = BlockPool::new(2, 4);
        let mut a = BlockTable::default();
        p.reserve(&mut a, 4).unwrap();
        assert_eq!(
            p.make_writable(&mut a, 4),
            Err(BlockError::Unreserved { pos: 4, blocks: 1 })
        );
        p.release_before(&mut a, 4);
        assert_eq!(
            p.make_writable(&mut a, 0),
            Err(BlockError::Released { pos: 0 })
        );
        // copy-on-write with nothing free
        let mut p = BlockPool::new(1, 4);
        let mut a = BlockTable::default();
        p.reserve(&mut a, 1).unwrap();
        let mut b = p.fork(&a, 1);
        assert_eq!(
            p.make_writable(&mut b, 0),
            Err(BlockError::OutOfBlocks { need: 1, free: 0 })
        );
        consistent(&p, &[&a, &b]);
    }

    #[test]
    fn a_sliding_window_gives_back_what_it_passed() {
        let mut p = BlockPool::new(4, 4);
        let mut a = BlockTable::default();
        p.reserve(&mut a, 12).unwrap();
        // window of 5 ending at position 11: positions 7.. are kept, block 0 (0..4) is not
        p.release_before(&mut a, 7);
        assert_eq!(a.blocks(), &[HOLE, 1, 2]);
        assert_eq!(a.held(), 2);
        assert_eq!(p.free_blocks(), 2);
        // growing reuses the released block
        p.reserve(&mut a, 16).unwrap();
        assert_eq!(a.blocks(), &[HOLE, 1, 2, 0]);
        consistent(&p, &[&a]);
        // a fork of a windowed table shares only what is held
        let b = p.fork(&a, 16);
        consistent(&p, &[&a, &b]);
        p.free(a);
        p.free(b);
        assert_eq!(p.free_blocks(), 4);
    }
}
