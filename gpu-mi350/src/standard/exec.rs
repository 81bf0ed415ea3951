//! Running a step: check and upload its inputs, launch it (a graph replay
//! when its shape allows, else direct launches), and read back only what
//! the caller asks for (sampled tokens, logits rows, taps).

use m3_core::backend::{StepBatch, TapRequest, Taps};
use m3_core::sample::SampleParams;

use super::graphs::GraphKey;
use super::step::{Extras, TapBufs};
use super::StandardPath;
use crate::error::{GpuError, Result};
use crate::model::{DevBuf, DevFfn};

/// The shape of the uploaded step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub rows: usize,
    pub logits_rows: usize,
}

impl StandardPath {
    /// Check `step` against the capacity and the pool, and upload it with
    /// its sampling parameters (one per logits row).
    pub fn prepare(&mut self, step: &StepBatch, sampling: &[SampleParams]) -> Result<Shape> {
        let c = &self.model.config;
        let bad = |why: String| GpuError::input("step", why);
        step.validate(self.cap.page_size, self.kv.num_pages, c.vocab_size)
            .map_err(|e| bad(e.to_string()))?;
        let t = step.rows();
        let nl = step.logits_rows.len();
        if t == 0 || t > self.cap.max_rows {
            return Err(bad(format!(
                "{t} rows (this runner takes 1 to {} rows a step: --max-batch-tokens)",
                self.cap.max_rows
            )));
        }
        if step.seqs.len() > self.cap.max_seqs {
            return Err(bad(format!(
                "{} sequences (this runner takes at most {}: --max-seqs)",
                step.seqs.len(),
                self.cap.max_seqs
            )));
        }
        if sampling.len() != nl {
            return Err(bad(format!(
                "{} sampling entries for {nl} logits rows",
                sampling.len()
            )));
        }
        if let Some(&p) = step.positions.iter().max() {
            if p as usize >= self.cap.max_context {
                return Err(bad(format!(
                    "position {p} is past the longest context {} (--max-context)",
                    self.cap.max_context
                )));
            }
        }
        self.inputs.upload(self.l.stream(), step, sampling)?;
        Ok(Shape {
            rows: t,
            logits_rows: nl,
        })
    }

    /// Launch the uploaded step: a graph replay (captured on first use)
    /// when `graph` and its shape allows, else direct launches.
    /// A decode step up to the mono threshold (`mono_max_rows`) runs on the mono path
    /// when the path has it and it is on (its own graphs: `GraphKey::mono`).
    pub fn launch(&mut self, s: Shape, graph: bool) -> Result<()> {
        let mono = self.mono_for(s.rows);
        if mono {
            self.mono_prepare(s.rows)?;
            self.mono_steps += 1;
        }
        let key = GraphKey {
            rows: s.rows,
            logits_rows: s.logits_rows,
            variant: self.variant_for(s.rows),
            mono,
        };
        let run = |p: &Self| {
            if mono {
                p.enqueue_mono(s.rows, s.logits_rows, false)
            } else {
                p.enqueue(s.rows, s.logits_rows, &Extras::default())
            }
        };
        if graph && self.graphable(s.rows) && self.graphs.can_hold(&key) {
            let mut graphs = std::mem::replace(&mut self.graphs, super::graphs::Graphs::new(0));
            let r = graphs.run(&self.l, key, || run(self));
            self.graphs = graphs;
            r
        } else {
            run(self)
        }
    }

    /// Launch the uploaded step directly with captures and / or teacher
    /// residuals (`teacher[l]`: `[T, H]` f32 replacing the residual after
    /// layer `l`). Returns the tap buffers to read with [`Self::read_taps`].
    pub(crate) fn launch_with(
        &mut self,
        s: Shape,
        taps: TapRequest,
        teacher: Option<&std::collections::BTreeMap<usize, Vec<f32>>>,
    ) -> Result<Option<TapBufs>> {
        let c = &self.model.config;
        let (t, h, nl) = (s.rows, c.hidden_size, c.num_hidden_layers);
        if taps.index_scores {
            return Err(GpuError::input(
                "taps",
                "index_scores are not captured by the GPU runner (the CPU reference has them)",
            ));
        }
        let tb = if taps.any_layer_family() {
            Some(TapBufs::new(self.l.device(), taps, nl, t, h)?)
        } else {
            None
        };
        let mut tbuf = None;
        let mut has = vec![false; nl];
        if let Some(tm) = teacher.filter(|m| !m.is_empty()) {
            let buf = DevBuf::zeroed(self.l.device(), nl * t * h * 4)?;
            for (&l, v) in tm {
                if l >= nl || v.len() != t * h {
                    return Err(GpuError::input(
                        "teacher",
                        format!(
                            "residual.{l}: {} values for a model of {nl} layers and [{t}, {h}]",
                            v.len()
                        ),
                    ));
                }
                buf.write_async(self.l.stream(), l * t * h * 4, v)?;
                has[l] = true;
            }
            tbuf = Some(buf);
        }
        let ex = Extras {
            taps: tb.as_ref(),
            teacher: tbuf.as_ref().map(|b| (b, has.as_slice())),
        };
        self.enqueue(t, s.logits_rows, &ex)?;
        // the teacher buffer must outlive the launches reading it
        self.l.sync()?;
        drop(tbuf);
        Ok(tb)
    }

    /// The sampled token of every logits row of the last step (waits).
    pub fn read_tokens(&self, nl: usize) -> Result<Vec<u32>> {
        let mut out = vec![0u32; nl];
        self.acts.tok_out.read(self.l.stream(), 0, &mut out)?;
        Ok(out)
    }

    /// Logits of the listed logits rows (indices into the step's logits
    /// rows) of the last step, `[rows.len(), vocab]` (waits).
    pub fn read_logits(&self, rows: &[u32]) -> Result<Vec<f32>> {
        let v = self.model.config.vocab_size;
        let mut out = vec![0f32; rows.len() * v];
        for (i, &r) in rows.iter().enumerate() {
            self.acts.logits.read(
                self.l.stream(),
                r as usize * v * 4,
                &mut out[i * v..(i + 1) * v],
            )?;
        }
        Ok(out)
    }

    /// Experts chosen per layer in the last step (`[L][t * top_k]`; empty
    /// for dense layers).
    pub fn experts_chosen(&self, t: usize) -> Result<Vec<Vec<i32>>> {
        let c = &self.model.config;
        let k = c.num_experts_per_tok;
        let mut out = Vec::new();
        for (l, lw) in self.model.layers.iter().enumerate() {
            let mut v = vec![0i32; t * k];
            if matches!(lw.ffn, DevFfn::Moe { .. }) {
                self.acts
                    .ids
                    .read(self.l.stream(), l * self.cap.max_rows * k * 4, &mut v)?;
            } else {
                v.clear();
            }
            out.push(v);
        }
        Ok(out)
    }

    /// Blocks selected per layer in the last step (`[L][kv_heads * t * K]`,
    /// the kernel's order; empty for full layers).
    pub fn blocks_selected(&self, t: usize) -> Result<Vec<Vec<i32>>> {
        let c = &self.model.config;
        let (nkv, kb) = (c.num_key_value_heads, c.index_topk_blocks);
        let mut out = Vec::new();
        for (l, lw) in self.model.layers.iter().enumerate() {
            if lw.indexer.is_none() {
                out.push(Vec::new());
                continue;
            }
            let mut v = vec![0i32; nkv * t * kb];
            self.acts.sel.read(
                self.l.stream(),
                l * nkv * self.cap.max_rows * kb * 4,
                &mut v,
            )?;
            out.push(v);
        }
        Ok(out)
    }

    /// The captures of a step run by [`Self::launch_with`], in the names and
    /// layouts of `m3_core::backend::taps` (`logits` is added by the caller
    /// from the logits read back).
    pub(crate) fn read_taps(&self, tb: &TapBufs) -> Result<Taps> {
        let c = &self.model.config;
        let (t, h) = (tb.t, c.hidden_size);
        let req = tb.req;
        let mut taps = Taps::new(req);
        let f32_family = |taps: &mut Taps, b: &Option<DevBuf>, name: &str| -> Result<()> {
            let Some(buf) = b else { return Ok(()) };
            for (l, s) in tb.slot.iter().enumerate() {
                let Some(s) = s else { continue };
                let mut v = vec![0f32; t * h];
                buf.read(self.l.stream(), s * t * h * 4, &mut v)?;
                taps.put_f32(format!("{name}.{l}"), vec![t, h], v);
            }
            Ok(())
        };
        f32_family(&mut taps, &tb.residual, "residual")?;
        f32_family(&mut taps, &tb.attn_out, "attn_out")?;
        f32_family(&mut taps, &tb.ffn_in, "ffn_in")?;
        f32_family(&mut taps, &tb.ffn_out, "ffn_out")?;
        if req.experts {
            let k = c.num_experts_per_tok;
            for (l, ids) in self.experts_chosen(t)?.into_iter().enumerate() {
                if !ids.is_empty() && req.layer(l) {
                    taps.put_i32(format!("experts.{l}"), vec![t, k], ids);
                }
            }
        }
        if req.topk_blocks {
            let (nkv, kb) = (c.num_key_value_heads, c.index_topk_blocks);
            for (l, mut sel) in self.blocks_selected(t)?.into_iter().enumerate() {
                if sel.is_empty() || !req.layer(l) {
                    continue;
                }
                // the tap's order: valid ids ascending, then -1 padding
                for row in sel.chunks_mut(kb) {
                    let mut ids: Vec<i32> = row.iter().copied().filter(|&b| b >= 0).collect();
                    ids.sort_unstable();
                    ids.resize(kb, -1);
                    row.copy_from_slice(&ids);
                }
                taps.put_i32(format!("topk_blocks.{l}"), vec![nkv, t, kb], sel);
            }
        }
        Ok(taps)
    }
}
