//! The block allocator of the paged KV cache and the index (indexer-key)
//! cache.
//!
//! Both caches hold one row per token position, so one block table per
//! sequence addresses both: block `b` covers slots `b * block_size ..
//! (b + 1) * block_size` in each cache. The pool has a fixed number of
//! blocks; each has a reference count (sequences sharing a prefix hold the
//! same block). A block is *writable* only when exactly one sequence holds it
//! and it is not in the prefix cache; a write into any other block first
//! copies it (copy-on-write) and hands the copy instruction to the backend,
//! which executes it before the step's rows are written.

use alloc::collections::VecDeque;
use alloc::vec;
use alloc::vec::Vec;

use super::prefix::{BlockHash, PrefixCache};
use super::SchedError;

/// Index of a block in the KV / index cache pools.
pub type BlockId = u32;

/// "Copy every slot of block `src` into block `dst`" in the KV cache and the
/// index cache, to be run by the backend before the step's writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    pub src: BlockId,
    pub dst: BlockId,
}

/// Fixed pool of KV blocks with reference counts, a free list and the prefix
/// cache's idle blocks as a second source of free space.
#[derive(Clone, Debug)]
pub struct BlockPool {
    block_size: usize,
    ref_counts: Vec<u32>,
    /// Unreferenced, uncached blocks (FIFO so freed blocks are reused last).
    free: VecDeque<BlockId>,
    cache: PrefixCache,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks of `block_size` token slots each.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self, SchedError> {
        if num_blocks == 0 || block_size == 0 || num_blocks > u32::MAX as usize / block_size {
            return Err(SchedError::Config(
                "num_blocks and block_size must be > 0 and their product fit in u32",
            ));
        }
        Ok(Self {
            block_size,
            ref_counts: vec![0; num_blocks],
            free: (0..num_blocks as BlockId).collect(),
            cache: PrefixCache::new(num_blocks),
        })
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Total blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks that an allocation can take now: free ones plus idle cached ones.
    pub fn num_available(&self) -> usize {
        self.free.len() + self.cache.idle_len()
    }

    /// Blocks on the free list proper (not counting idle cached blocks).
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Current reference count of `b` (0 for an unknown id).
    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.ref_counts.get(b as usize).copied().unwrap_or(0)
    }

    /// The prefix cache (read-only view).
    pub fn cache(&self) -> &PrefixCache {
        &self.cache
    }

    /// Take one block (reference count 1): from the free list, else by
    /// evicting the least recently used idle cached block.
    pub fn allocate(&mut self) -> Result<BlockId, SchedError> {
        let b = match self.free.pop_front() {
            Some(b) => b,
            None => self.cache.evict_lru().ok_or(SchedError::OutOfBlocks)?,
        };
        self.ref_counts[b as usize] = 1;
        Ok(b)
    }

    /// Add a reference to an allocated or cached block (prefix sharing).
    pub fn retain(&mut self, b: BlockId) -> Result<(), SchedError> {
        let rc = self
            .ref_counts
            .get_mut(b as usize)
            .ok_or(SchedError::BadBlock(b))?;
        if *rc == 0 {
            if !self.cache.is_idle(b) {
                return Err(SchedError::BadBlock(b));
            }
            self.cache.mark_used(b);
        }
        *rc += 1;
        Ok(())
    }

    /// Drop a reference; at zero the block goes back to the free list, or to
    /// the idle LRU if it is cached. Releasing an unreferenced block is an
    /// error, never an underflow.
    pub fn release(&mut self, b: BlockId) -> Result<(), SchedError> {
        let rc = self
            .ref_counts
            .get_mut(b as usize)
            .ok_or(SchedError::BadBlock(b))?;
        if *rc == 0 {
            return Err(SchedError::BadBlock(b));
        }
        *rc -= 1;
        if *rc == 0 {
            if self.cache.is_cached(b) {
                self.cache.mark_idle(b);
            } else {
                self.free.push_back(b);
            }
        }
        Ok(())
    }

    /// Whether a sequence holding `b` may write into it in place.
    pub fn is_writable(&self, b: BlockId) -> bool {
        self.ref_count(b) == 1 && !self.cache.is_cached(b)
    }

    /// Make `b` writable for the caller, who holds one reference to it:
    /// returns `b` itself when it already is, otherwise a fresh block and the
    /// copy the backend must perform (the caller's reference moves from `b`
    /// to the copy).
    pub fn make_writable(
        &mut self,
        b: BlockId,
    ) -> Result<(BlockId, Option<BlockCopy>), SchedError> {
        if self.ref_count(b) == 0 {
            return Err(SchedError::BadBlock(b));
        }
        if self.is_writable(b) {
            return Ok((b, None));
        }
        let dst = self.allocate()?;
        self.release(b)?;
        Ok((dst, Some(BlockCopy { src: b, dst })))
    }

    /// The cached block for a full block with key `hash` and `tokens`.
    pub fn lookup(&self, hash: BlockHash, tokens: &[u32]) -> Option<BlockId> {
        self.cache.lookup(hash, tokens)
    }

    /// Register the full, computed block `b` in the prefix cache (a no-op
    /// when the key is already cached by another block).
    pub fn register(&mut self, b: BlockId, hash: BlockHash, tokens: &[u32]) -> bool {
        if self.ref_count(b) == 0 || tokens.len() != self.block_size {
            return false;
        }
        self.cache.insert(b, hash, tokens)
    }

    /// Self-check used by tests: every block is in exactly one state (free
    /// list, idle cached, or referenced), so blocks are conserved.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let n = self.num_blocks();
        let mut seen = vec![false; n];
        for &b in &self.free {
            let i = b as usize;
            if i >= n || seen[i] {
                return Err("block twice on the free list");
            }
            seen[i] = true;
            if self.ref_counts[i] != 0 || self.cache.is_cached(b) {
                return Err("free-list block referenced or cached");
            }
        }
        let mut idle = 0;
        for (i, seen_i) in seen.iter_mut().enumerate() {
            let b = i as BlockId;
            if self.cache.is_idle(b) {
                idle += 1;
                if *seen_i || self.ref_counts[i] != 0 {
                    return Err("idle cached block also free or referenced");
                }
                *seen_i = true;
            } else if self.ref_counts[i] > 0 {
                if *seen_i {
                    return Err("referenced block on the free list");
                }
                *seen_i = true;
            }
        }
        if idle != self.cache.idle_len() {
            return Err("idle LRU out of sync");
        }
        if seen.iter().any(|s| !s) {
            return Err("block lost (neither free, idle nor referenced)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::prefix::{chain_hash, ROOT_HASH};

    #[test]
    fn allocate_release_and_exhaustion() {
        let mut p = BlockPool::new(2, 4).unwrap();
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        assert_ne!(a, b);
        assert_eq!(p.allocate(), Err(SchedError::OutOfBlocks));
        p.release(a).unwrap();
        assert_eq!(
            p.release(a),
            Err(SchedError::BadBlock(a)),
            "no negative refcount"
        );
        assert_eq!(p.allocate().unwrap(), a, "freed block reusable");
        p.check_invariants().unwrap();
    }

    #[test]
    fn cow_of_shared_block_returns_copy() {
        let mut p = BlockPool::new(3, 4).unwrap();
        let a = p.allocate().unwrap();
        p.retain(a).unwrap(); // second sequence shares it
        let (dst, copy) = p.make_writable(a).unwrap();
        assert_ne!(dst, a);
        assert_eq!(copy, Some(BlockCopy { src: a, dst }));
        assert_eq!(p.ref_count(a), 1);
        assert_eq!(p.ref_count(dst), 1);
        // The remaining holder of `a` may now write in place.
        assert_eq!(p.make_writable(a).unwrap(), (a, None));
        p.check_invariants().unwrap();
    }

    #[test]
    fn cached_blocks_are_read_only_idle_then_evicted() {
        let mut p = BlockPool::new(2, 2).unwrap();
        let a = p.allocate().unwrap();
        let h = chain_hash(ROOT_HASH, &[5, 6]);
        assert!(p.register(a, h, &[5, 6]));
        assert!(!p.is_writable(a));
        p.release(a).unwrap();
        assert_eq!(p.num_available(), 2);
        assert_eq!(p.lookup(h, &[5, 6]), Some(a));
        p.retain(a).unwrap(); // a hit revives it
        p.release(a).unwrap();
        let _b = p.allocate().unwrap(); // free list first
        let c = p.allocate().unwrap(); // then evicts the idle cached block
        assert_eq!(c, a);
        assert_eq!(p.lookup(h, &[5, 6]), None);
        p.check_invariants().unwrap();
    }
}
