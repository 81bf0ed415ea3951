//! Prefix cache: full KV blocks found again by the content of the whole prefix
//! that produced them.
//!
//! A full block's key is a chained hash `H_i = hash(H_{i-1}, tokens of block i)`
//! with `H_{-1}` a fixed root, so a key names the block's tokens *and* every
//! token before it (the KV of a position depends on its whole prefix). Keys
//! are 128 bits (two independently seeded 64-bit lanes) and a hit also
//! compares the stored block tokens, so a false hit needs a 128-bit collision.
//!
//! Cached blocks whose reference count drops to zero stay cached but become
//! *idle*; idle blocks are the eviction pool, least recently released first.
//! The cache holds no reference itself: ownership and counts live in
//! [`super::blocks::BlockPool`].

use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

use super::blocks::BlockId;

/// The chained key of one full block (see the module docs).
pub type BlockHash = u128;

/// Key of the empty prefix: the parent of block 0.
pub const ROOT_HASH: BlockHash = 0x6d33_5f70_7265_6669_785f_726f_6f74_0001;

/// One 64-bit lane of the chained hash: a SplitMix64-style finaliser applied
/// after folding in each token (cheap, well mixed, deterministic everywhere).
fn lane(mut h: u64, tokens: &[u32], seed: u64) -> u64 {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    h = mix(h ^ seed);
    for &t in tokens {
        h = mix(h.wrapping_add(0x9e37_79b9_7f4a_7c15) ^ u64::from(t));
    }
    mix(h ^ (tokens.len() as u64))
}

/// `hash(parent, tokens)`: the key of a full block whose prefix has key `parent`.
pub fn chain_hash(parent: BlockHash, tokens: &[u32]) -> BlockHash {
    let hi = lane(
        (parent >> 64) as u64 ^ (parent as u64).rotate_left(17),
        tokens,
        0x243f_6a88_85a3_08d3,
    );
    let lo = lane(
        parent as u64 ^ ((parent >> 64) as u64).rotate_left(41),
        tokens,
        0x1319_8a2e_0370_7344,
    );
    (u128::from(hi) << 64) | u128::from(lo)
}

/// The keys of every *full* block of `tokens` (a trailing partial block has none).
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    let mut out = Vec::with_capacity(tokens.len() / block_size.max(1));
    let mut parent = ROOT_HASH;
    for chunk in tokens.chunks_exact(block_size.max(1)) {
        parent = chain_hash(parent, chunk);
        out.push(parent);
    }
    out
}

/// What the cache remembers about one cached block.
#[derive(Clone, Debug)]
struct Entry {
    hash: BlockHash,
    /// The block's own tokens, compared on every hit.
    tokens: Vec<u32>,
    /// Set while the block is idle (reference count 0): its LRU tick.
    idle_tick: Option<u64>,
}

/// Hash -> block map plus the LRU list of idle cached blocks.
#[derive(Clone, Debug)]
pub struct PrefixCache {
    by_hash: BTreeMap<BlockHash, BlockId>,
    /// Indexed by block id.
    entries: Vec<Option<Entry>>,
    /// Idle cached blocks by release tick (oldest first).
    idle: BTreeMap<u64, BlockId>,
    tick: u64,
}

impl PrefixCache {
    /// An empty cache for a pool of `num_blocks` blocks.
    pub fn new(num_blocks: usize) -> Self {
        Self {
            by_hash: BTreeMap::new(),
            entries: vec![None; num_blocks],
            idle: BTreeMap::new(),
            tick: 0,
        }
    }

    /// The cached block holding exactly `tokens` under key `hash`, if any.
    pub fn lookup(&self, hash: BlockHash, tokens: &[u32]) -> Option<BlockId> {
        let b = *self.by_hash.get(&hash)?;
        let e = self.entries.get(b as usize)?.as_ref()?;
        (e.tokens == tokens).then_some(b)
    }

    /// Whether block `b` is in the cache (cached blocks are never written again).
    pub fn is_cached(&self, b: BlockId) -> bool {
        self.entries.get(b as usize).is_some_and(Option::is_some)
    }

    /// Whether block `b` is cached and idle (evictable).
    pub fn is_idle(&self, b: BlockId) -> bool {
        self.entries
            .get(b as usize)
            .and_then(Option::as_ref)
            .is_some_and(|e| e.idle_tick.is_some())
    }

    /// Number of idle (evictable) cached blocks.
    pub fn idle_len(&self) -> usize {
        self.idle.len()
    }

    /// Number of cached blocks, idle or in use.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// Record that in-use block `b` holds `tokens` under `hash`. Returns false
    /// (and changes nothing) when the key is already cached by another block
    /// or `b` is already cached: the first copy wins.
    pub fn insert(&mut self, b: BlockId, hash: BlockHash, tokens: &[u32]) -> bool {
        let Some(slot) = self.entries.get_mut(b as usize) else {
            return false;
        };
        if slot.is_some() || self.by_hash.contains_key(&hash) {
            return false;
        }
        *slot = Some(Entry {
            hash,
            tokens: tokens.to_vec(),
            idle_tick: None,
        });
        self.by_hash.insert(hash, b);
        true
    }

    /// Block `b` (cached) lost its last reference: it becomes evictable.
    pub(crate) fn mark_idle(&mut self, b: BlockId) {
        let tick = self.tick;
        if let Some(Some(e)) = self.entries.get_mut(b as usize) {
            if e.idle_tick.is_none() {
                e.idle_tick = Some(tick);
                self.idle.insert(tick, b);
                self.tick += 1;
            }
        }
    }

    /// Block `b` (cached, idle) was referenced again: it is no longer evictable.
    pub(crate) fn mark_used(&mut self, b: BlockId) {
        if let Some(Some(e)) = self.entries.get_mut(b as usize) {
            if let Some(t) = e.idle_tick.take() {
                self.idle.remove(&t);
            }
        }
    }

    /// Evict the least recently released idle block: it leaves the cache and
    /// is returned for reuse.
    pub(crate) fn evict_lru(&mut self) -> Option<BlockId> {
        let (&tick, &b) = self.idle.iter().next()?;
        self.idle.remove(&tick);
        if let Some(e) = self.entries.get_mut(b as usize).and_then(Option::take) {
            self.by_hash.remove(&e.hash);
        }
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_hash_depends_on_parent_and_tokens() {
        let a = chain_hash(ROOT_HASH, &[1, 2, 3, 4]);
        assert_ne!(a, chain_hash(ROOT_HASH, &[1, 2, 3, 5]));
        assert_ne!(chain_hash(a, &[7, 7]), chain_hash(ROOT_HASH, &[7, 7]));
        assert_eq!(a, chain_hash(ROOT_HASH, &[1, 2, 3, 4]));
        let hs = block_hashes(&[1, 2, 3, 4, 5, 6, 7], 2);
        assert_eq!(hs.len(), 3);
        assert_eq!(hs[1], chain_hash(hs[0], &[3, 4]));
    }

    #[test]
    fn lookup_checks_tokens_and_lru_evicts_oldest() {
        let mut c = PrefixCache::new(4);
        assert!(c.insert(0, 10, &[1, 2]));
        assert!(c.insert(1, 11, &[3, 4]));
        assert!(!c.insert(2, 10, &[1, 2]), "first copy wins");
        assert_eq!(c.lookup(10, &[1, 2]), Some(0));
        assert_eq!(c.lookup(10, &[1, 9]), None, "token mismatch is a miss");
        c.mark_idle(1);
        c.mark_idle(0);
        assert_eq!(c.idle_len(), 2);
        c.mark_used(1);
        assert_eq!(c.evict_lru(), Some(0));
        assert_eq!(c.lookup(10, &[1, 2]), None);
        assert_eq!(c.evict_lru(), None);
    }
}
