//! The step's inputs on the device: persistent buffers at fixed addresses
//! (a captured graph reads them), filled by one host-to-device copy per
//! step from a host staging area with the same layout.
//!
//! Layout (byte offsets fixed by capacity; `R` = max rows, `S` = max
//! sequences, `P` = pages per sequence):
//! `tokens[R] | pos[R] | slots[R] | row_seq[R] | lrows[R] | bt_off[S] |
//! sample[R] (RowSample) | bt[S * P]`, every section u32 but `sample`.
//! The block tables come last, so a step copies only the prefix it uses.

use m3_core::backend::StepBatch;
use m3_core::sample::SampleParams;

use crate::error::{GpuError, Result};
use crate::model::DevBuf;
use crate::runtime::api::{Device, Stream};
use crate::sampling::RowSample;

/// Byte offsets of the sections.
#[derive(Clone, Copy, Debug)]
struct Offsets {
    tokens: usize,
    pos: usize,
    slots: usize,
    row_seq: usize,
    lrows: usize,
    bt_off: usize,
    sample: usize,
    bt: usize,
    end: usize,
}

impl Offsets {
    fn new(rows: usize, seqs: usize, pages: usize) -> Self {
        let a16 = |x: usize| x.div_ceil(16) * 16;
        let tokens = 0;
        let pos = a16(tokens + 4 * rows);
        let slots = a16(pos + 4 * rows);
        let row_seq = a16(slots + 4 * rows);
        let lrows = a16(row_seq + 4 * rows);
        let bt_off = a16(lrows + 4 * rows);
        let sample = a16(bt_off + 4 * seqs);
        let bt = a16(sample + std::mem::size_of::<RowSample>() * rows);
        let end = bt + 4 * seqs * pages;
        Offsets {
            tokens,
            pos,
            slots,
            row_seq,
            lrows,
            bt_off,
            sample,
            bt,
            end,
        }
    }
}

/// The persistent step inputs.
pub struct StepInputs {
    buf: DevBuf,
    host: Vec<u8>,
    off: Offsets,
    rows: usize,
    seqs: usize,
    pages: usize,
}

impl StepInputs {
    /// Buffers for steps of up to `rows` rows and `seqs` sequences of up to
    /// `pages` pages each.
    pub fn new(dev: &Device, rows: usize, seqs: usize, pages: usize) -> Result<Self> {
        let off = Offsets::new(rows, seqs, pages);
        Ok(StepInputs {
            buf: DevBuf::zeroed(dev, off.end)?,
            host: vec![0u8; off.end],
            off,
            rows,
            seqs,
            pages,
        })
    }

    pub fn tokens(&self) -> u64 {
        self.buf.at(self.off.tokens)
    }
    pub fn pos(&self) -> u64 {
        self.buf.at(self.off.pos)
    }
    pub fn slots(&self) -> u64 {
        self.buf.at(self.off.slots)
    }
    pub fn row_seq(&self) -> u64 {
        self.buf.at(self.off.row_seq)
    }
    pub fn lrows(&self) -> u64 {
        self.buf.at(self.off.lrows)
    }
    pub fn bt_off(&self) -> u64 {
        self.buf.at(self.off.bt_off)
    }
    pub fn sample(&self) -> u64 {
        self.buf.at(self.off.sample)
    }
    pub fn bt(&self) -> u64 {
        self.buf.at(self.off.bt)
    }

    /// Stage `step` (validated by the caller) and its sampling parameters
    /// (one per logits row) and copy them to the device on `stream`.
    pub fn upload(
        &mut self,
        stream: &Stream,
        step: &StepBatch,
        sampling: &[SampleParams],
    ) -> Result<()> {
        let bad = |why: String| GpuError::input("step inputs", why);
        let t = step.rows();
        if t > self.rows || step.seqs.len() > self.seqs {
            return Err(bad(format!(
                "{t} rows / {} sequences past the capacity of {} / {}",
                step.seqs.len(),
                self.rows,
                self.seqs
            )));
        }
        if let Some(s) = step.seqs.iter().find(|s| s.block_table.len() > self.pages) {
            return Err(bad(format!(
                "request {}: a block table of {} blocks, past the {} of the longest context",
                s.request_id,
                s.block_table.len(),
                self.pages
            )));
        }
        let o = self.off;
        let h = &mut self.host;
        let put = |h: &mut [u8], at: usize, v: &[u32]| {
            h[at..at + 4 * v.len()].copy_from_slice(bytemuck::cast_slice(v));
        };
        put(h, o.tokens, &step.tokens);
        put(h, o.pos, &step.positions);
        put(h, o.slots, &step.slot_mapping);
        put(h, o.row_seq, &step.row_seq);
        put(h, o.lrows, &step.logits_rows);
        let mut at = 0u32;
        let mut bt_end = o.bt;
        for (i, s) in step.seqs.iter().enumerate() {
            put(h, o.bt_off + 4 * i, &[at]);
            put(h, o.bt + 4 * at as usize, &s.block_table);
            at += s.block_table.len() as u32;
            bt_end = o.bt + 4 * at as usize;
        }
        for (i, (&row, p)) in step.logits_rows.iter().zip(sampling).enumerate() {
            let key = step.positions[row as usize] + 1;
            let r = RowSample::new(p, key);
            let b = bytemuck::bytes_of(&r);
            h[o.sample + i * b.len()..o.sample + (i + 1) * b.len()].copy_from_slice(b);
        }
        self.buf.write_async(stream, 0, &self.host[..bt_end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_aligned_and_disjoint() {
        let o = Offsets::new(7, 3, 5);
        let starts = [
            o.tokens, o.pos, o.slots, o.row_seq, o.lrows, o.bt_off, o.sample, o.bt,
        ];
        for w in starts.windows(2) {
            assert!(w[0] < w[1]);
            assert_eq!(w[1] % 16, 0);
        }
        assert!(o.pos >= 4 * 7 && o.sample >= o.bt_off + 4 * 3);
        assert!(o.bt - o.sample >= std::mem::size_of::<RowSample>() * 7);
        assert_eq!(o.end, o.bt + 4 * 3 * 5);
    }
}
