//! `StepBatch`: the plain-data description of one forward step, made by the
//! planner (core `sched`, or the minimal `engine` loop) and consumed by every
//! backend. The core decides *what* runs; a backend only computes it.
//!
//! Layout conventions (all indices are `u32`, all arrays are per row unless
//! said otherwise):
//! - a *row* is one token processed in this step (prefill chunks, decode
//!   tokens and speculative verify tokens are all just rows);
//! - the KV cache is paged: a *page* holds `page_size` consecutive positions
//!   of one sequence; the *slot* of position `p` of a sequence is
//!   `block_table[p / page_size] * page_size + p % page_size`;
//! - every row's K/V (and index key) is written to its slot before any row of
//!   the step attends, so a row at position `p` sees every position `j <= p`
//!   of its own sequence that is cached before or during this step.

use alloc::vec::Vec;

/// One sequence (request) taking part in a step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepSeq {
    /// The request this sequence belongs to (for sampling keys and logs).
    pub request_id: u64,
    /// Physical KV page ids of this sequence in logical order: page `i` holds
    /// positions `i * page_size .. (i + 1) * page_size`. Must cover every
    /// position any of its rows attends to (`0..=max position`).
    pub block_table: Vec<u32>,
    /// Cached positions after this step (= the largest row position + 1 for
    /// the common contiguous case). Attention never reads past it.
    pub context_len: u32,
}

/// One forward step: tokens, positions, where their K/V go, which sequence
/// each row belongs to, and which rows need logits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepBatch {
    /// Token id of each row (`T` rows).
    pub tokens: Vec<u32>,
    /// Absolute position of each row in its sequence.
    pub positions: Vec<u32>,
    /// Physical cache slot of each row (`page * page_size + offset`).
    pub slot_mapping: Vec<u32>,
    /// Index into `seqs` of each row.
    pub row_seq: Vec<u32>,
    /// The sequences of this step.
    pub seqs: Vec<StepSeq>,
    /// Rows whose logits are computed, ascending (e.g. the last prompt row of
    /// a prefill, every decode row, every verify row).
    pub logits_rows: Vec<u32>,
    /// Set by the planner when the step is decode-only: every row is a decode
    /// row or a speculative verify row (the last committed token followed by
    /// draft tokens at consecutive positions), no prefill chunk. A verify
    /// step has several rows per sequence, so only this marker (not the row
    /// shape) tells it apart from a prompt chunk; `Path::Mono` relies on it.
    pub decode_only: bool,
}

/// Why a `StepBatch` is malformed (the planner broke a rule).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    #[error("step batch: {field} has {got} entries, expected {expected} (one per row)")]
    RowCount {
        field: &'static str,
        got: usize,
        expected: usize,
    },
    #[error("step batch: row {row} names sequence {seq}, but the step has {n} sequences")]
    BadSeq { row: usize, seq: u32, n: usize },
    #[error("step batch: row {row} at position {pos} is outside its block table ({pages} pages of {page_size})")]
    PastBlockTable {
        row: usize,
        pos: u32,
        pages: usize,
        page_size: usize,
    },
    #[error(
        "step batch: row {row} slot {slot} does not match its block table (expected {expected})"
    )]
    SlotMismatch {
        row: usize,
        slot: u32,
        expected: u32,
    },
    #[error("step batch: page {page} of sequence {seq} is outside the cache ({pages} pages)")]
    PageOutOfRange { seq: usize, page: u32, pages: usize },
    #[error("step batch: row {row} position {pos} is not below its sequence's context_len {ctx}")]
    PastContext { row: usize, pos: u32, ctx: u32 },
    #[error("step batch: logits_rows must be ascending row indices below {rows}")]
    BadLogitsRows { rows: usize },
    #[error("step batch: token {token} at row {row} is outside the vocabulary ({vocab})")]
    TokenOutOfRange {
        row: usize,
        token: u32,
        vocab: usize,
    },
}

impl StepBatch {
    /// Number of rows `T`.
    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    /// Request id of row `row`.
    pub fn request_id(&self, row: usize) -> u64 {
        self.seqs[self.row_seq[row] as usize].request_id
    }

    /// The sequence of row `row`.
    pub fn seq_of(&self, row: usize) -> &StepSeq {
        &self.seqs[self.row_seq[row] as usize]
    }

    /// True for a pure decode step, the only kind `Path::Mono` accepts:
    /// either the planner marked it [`StepBatch::decode_only`] and each
    /// sequence's rows sit at consecutive positions ending at its
    /// `context_len - 1` (decode and verify rows always do), or, unmarked,
    /// every sequence contributes exactly one row.
    pub fn is_pure_decode(&self) -> bool {
        if self.decode_only {
            return self.rows_end_each_sequence();
        }
        let mut seen = alloc::vec![false; self.seqs.len()];
        for &s in &self.row_seq {
            let s = s as usize;
            if s >= seen.len() || seen[s] {
                return false;
            }
            seen[s] = true;
        }
        true
    }

    /// Each sequence's rows are at consecutive ascending positions whose
    /// last is `context_len - 1` (the shape of decode and verify rows).
    fn rows_end_each_sequence(&self) -> bool {
        let n = self.seqs.len();
        // Next expected position per sequence, None before its first row.
        let mut next: Vec<Option<u32>> = alloc::vec![None; n];
        for (t, &s) in self.row_seq.iter().enumerate() {
            let s = s as usize;
            let Some(&p) = self.positions.get(t) else {
                return false;
            };
            if s >= n || next[s].is_some_and(|e| e != p) {
                return false;
            }
            next[s] = Some(p + 1);
        }
        next.iter()
            .zip(&self.seqs)
            .all(|(e, q)| e.is_none_or(|e| e == q.context_len))
    }

    /// Check every invariant a backend relies on: per-row array lengths,
    /// sequence indices, positions covered by the block tables, slots equal
    /// to what the block tables say, pages inside a cache of `num_pages`,
    /// tokens inside the vocabulary, `logits_rows` ascending.
    pub fn validate(
        &self,
        page_size: usize,
        num_pages: usize,
        vocab: usize,
    ) -> Result<(), StepError> {
        let t = self.tokens.len();
        for (field, got) in [
            ("positions", self.positions.len()),
            ("slot_mapping", self.slot_mapping.len()),
            ("row_seq", self.row_seq.len()),
        ] {
            if got != t {
                return Err(StepError::RowCount {
                    field,
                    got,
                    expected: t,
                });
            }
        }
        for (si, s) in self.seqs.iter().enumerate() {
            if let Some(&page) = s.block_table.iter().find(|&&p| p as usize >= num_pages) {
                return Err(StepError::PageOutOfRange {
                    seq: si,
                    page,
                    pages: num_pages,
                });
            }
        }
        for row in 0..t {
            let seq = self.row_seq[row];
            let s = self.seqs.get(seq as usize).ok_or(StepError::BadSeq {
                row,
                seq,
                n: self.seqs.len(),
            })?;
            let pos = self.positions[row];
            if self.tokens[row] as usize >= vocab {
                return Err(StepError::TokenOutOfRange {
                    row,
                    token: self.tokens[row],
                    vocab,
                });
            }
            if pos >= s.context_len {
                return Err(StepError::PastContext {
                    row,
                    pos,
                    ctx: s.context_len,
                });
            }
            let page_idx = pos as usize / page_size;
            let Some(&page) = s.block_table.get(page_idx) else {
                return Err(StepError::PastBlockTable {
                    row,
                    pos,
                    pages: s.block_table.len(),
                    page_size,
                });
            };
            let expected = page * page_size as u32 + pos % page_size as u32;
            if self.slot_mapping[row] != expected {
                return Err(StepError::SlotMismatch {
                    row,
                    slot: self.slot_mapping[row],
                    expected,
                });
            }
            if (s.context_len as usize).div_ceil(page_size) > s.block_table.len() {
                return Err(StepError::PastBlockTable {
                    row,
                    pos: s.context_len - 1,
                    pages: s.block_table.len(),
                    page_size,
                });
            }
        }
        let mut prev: Option<u32> = None;
        for &r in &self.logits_rows {
            if r as usize >= t || prev.is_some_and(|p| p >= r) {
                return Err(StepError::BadLogitsRows { rows: t });
            }
            prev = Some(r);
        }
        Ok(())
    }

    /// A step for one sequence: `tokens` at positions `start..start+len`,
    /// with slots from `block_table`; `logits` selects every row (`true`) or
    /// only the last one (`false`).
    pub fn contiguous(
        request_id: u64,
        tokens: &[u32],
        start: u32,
        block_table: &[u32],
        page_size: usize,
        all_logits: bool,
    ) -> Self {
        let n = tokens.len() as u32;
        let positions: Vec<u32> = (start..start + n).collect();
        let slot_mapping = positions
            .iter()
            .map(|&p| {
                let page = block_table
                    .get(p as usize / page_size)
                    .copied()
                    .unwrap_or(u32::MAX);
                page.wrapping_mul(page_size as u32)
                    .wrapping_add(p % page_size as u32)
            })
            .collect();
        let logits_rows = if all_logits {
            (0..n).collect()
        } else if n > 0 {
            alloc::vec![n - 1]
        } else {
            Vec::new()
        };
        StepBatch {
            tokens: tokens.to_vec(),
            positions,
            slot_mapping,
            row_seq: alloc::vec![0; n as usize],
            seqs: alloc::vec![StepSeq {
                request_id,
                block_table: block_table.to_vec(),
                context_len: start + n,
            }],
            logits_rows,
            decode_only: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Path;

    #[test]
    fn contiguous_step_validates_and_catches_bad_slots() {
        // Pages [3, 1]: position 5 (page 1 of size 4) lives in slot 1*4 + 1 = 5.
        let s = StepBatch::contiguous(7, &[10, 11, 12, 13, 14, 15], 0, &[3, 1], 4, false);
        assert_eq!(s.slot_mapping, [12, 13, 14, 15, 4, 5]);
        assert_eq!(s.logits_rows, [5]);
        s.validate(4, 4, 100).unwrap();
        assert!(!s.is_pure_decode());
        let mut bad = s.clone();
        bad.slot_mapping[4] = 6;
        assert_eq!(
            bad.validate(4, 4, 100),
            Err(StepError::SlotMismatch {
                row: 4,
                slot: 6,
                expected: 4
            })
        );
        assert!(matches!(
            s.validate(4, 3, 100),
            Err(StepError::PageOutOfRange { .. })
        ));
        assert!(matches!(
            s.validate(4, 4, 12),
            Err(StepError::TokenOutOfRange { .. })
        ));
        let mut short = s.clone();
        short.seqs[0].block_table.pop();
        assert!(matches!(
            short.validate(4, 4, 100),
            Err(StepError::PastBlockTable { .. })
        ));
    }

    #[test]
    fn mono_only_for_small_pure_decode() {
        let one = StepBatch::contiguous(1, &[5], 9, &[0, 1, 2], 4, true);
        assert!(Path::Mono.allows(&one) && Path::Standard.allows(&one));
        let two_rows_one_seq = StepBatch::contiguous(1, &[5, 6], 9, &[0, 1, 2], 4, true);
        assert!(!Path::Mono.allows(&two_rows_one_seq));
        // 1 + MONO_MAX_ROWS one-row sequences: past the widest mono step
        let n = crate::backend::MONO_MAX_ROWS as u32 + 1;
        let mut wide = StepBatch::default();
        for i in 0..n {
            wide.tokens.push(1);
            wide.positions.push(0);
            wide.slot_mapping.push(i * 4);
            wide.row_seq.push(i);
            wide.seqs.push(StepSeq {
                request_id: i as u64,
                block_table: alloc::vec![i],
                context_len: 1,
            });
        }
        assert!(wide.is_pure_decode() && !Path::Mono.allows(&wide));
        wide.validate(4, n as usize, 2).unwrap();
        // one row fewer: the widest mono step
        let mut widest = wide.clone();
        widest.tokens.pop();
        widest.positions.pop();
        widest.slot_mapping.pop();
        widest.row_seq.pop();
        widest.seqs.pop();
        assert!(widest.is_pure_decode() && Path::Mono.allows(&widest));
    }

    #[test]
    fn mono_for_marked_verify_steps() {
        // A verify step: the last committed token at 9 plus 3 drafts.
        let mut v = StepBatch::contiguous(1, &[5, 6, 7, 8], 9, &[0, 1, 2, 3], 4, true);
        assert!(
            !Path::Mono.allows(&v),
            "unmarked: looks like a prompt chunk"
        );
        v.decode_only = true;
        assert!(v.is_pure_decode() && Path::Mono.allows(&v));
        // Marked but the rows do not end at context_len - 1: refused.
        let mut gap = v.clone();
        gap.seqs[0].context_len += 1;
        assert!(!Path::Mono.allows(&gap));
        // Marked but non-consecutive positions: refused.
        let mut hole = v.clone();
        hole.positions[2] += 1;
        assert!(!Path::Mono.allows(&hole));
        // Marked, MONO_MAX_ROWS + 1 rows: Standard only.
        let toks: Vec<u32> = (0..crate::backend::MONO_MAX_ROWS as u32 + 1).collect();
        let table: Vec<u32> = (0..toks.len().div_ceil(4) as u32).collect();
        let mut big = StepBatch::contiguous(1, &toks, 0, &table, 4, true);
        big.decode_only = true;
        assert!(big.is_pure_decode() && !Path::Mono.allows(&big));
    }
}
