//! The Gemma 4 MTP assistant head (HF `gemma4_assistant` / `Gemma4AssistantForCausalLM`).
//!
//! A small Gemma 4 decoder whose layers own no K/V: every layer attends, with its own queries,
//! over the TARGET's cache (sliding layers over the cache of the target's last sliding layer,
//! full layers over that of its last full layer, following the target's KV sharing). One draft
//! step, as transformers' `Gemma4AssistantCandidateGenerator` runs it:
//! ```text
//! x = pre_projection([target_embed(token) * sqrt(H_target) ; h])      h: target hidden [1, H_target]
//! x = decoder layers(x) at position `pos` (queries only, bidirectional over the target cache)
//! y = final_norm(x);  logits = y @ embed^T;  h_next = post_projection(y)
//! ```
//! `h` is the target's post-final-norm hidden state of the position before `pos` for the first
//! step, then the assistant's `h_next`; transformers keeps `pos` fixed across draft steps.
//! Only the HF layout is read (`use_ordered_embeddings` checkpoints, whose head keeps only the
//! tokens of the top centroid clusters, are refused); see the report for the GGUF layout.

use std::sync::Arc;

use crate::arch::Detected;
use crate::backend::{Backend, LogitRows, StepPlan};
use crate::model::gemma::config::{self, bad};
use crate::model::gemma::layers::GemmaWeights;
use crate::model::gemma::spec::GemmaSpec;
use crate::model::gemma::weights::{global_name, me, Loader};
use crate::model::gemma::{GemmaModel, GemmaSession};
use crate::model::{Logits, ModelError};
use crate::weights::Checkpoint;

const ARCH: &str = "gemma4-assistant";

pub struct Gemma4Assistant<B: Backend> {
    /// The assistant's own decoder (layers without K/V, norms, MLPs, embedding/head).
    pub model: GemmaModel<B>,
    /// `[H_a, 2 * H_target]`
    pub pre_projection: B::Weight,
    /// `[H_target, H_a]`
    pub post_projection: B::Weight,
    pub backbone_hidden: usize,
}

/// One draft step's result.
pub struct Draft<B: Backend> {
    pub logits: Logits,
    /// The next step's `h` (`[1, H_target]`).
    pub hidden: B::Tensor,
}

impl<B: Backend> Gemma4Assistant<B> {
    /// Load an assistant checkpoint (HF layout) for use with targets like `target`.
    pub fn load(
        ckpt: &Checkpoint,
        det: &Detected,
        backend: Arc<B>,
        target: &GemmaSpec,
    ) -> Result<Self, ModelError> {
        let cfg = ckpt
            .config()
            .ok_or_else(|| bad(ARCH, "no config.json beside the weights"))?;
        if config::jb(cfg, "use_ordered_embeddings") == Some(true) {
            return Err(bad(
                ARCH,
                "use_ordered_embeddings (centroid-masked head) is not supported",
            ));
        }
        let backbone_hidden = config::ju(cfg, "backbone_hidden_size").unwrap_or(1536);
        if backbone_hidden != target.hidden {
            return Err(bad(
                ARCH,
                format!(
                    "built for a {backbone_hidden}-wide target, not {}",
                    target.hidden
                ),
            ));
        }
        let naming = super::naming(det);
        let embed = ckpt.tensor(&global_name(&naming, "embed")).map_err(me)?;
        let vocab = embed.shape.first().copied().unwrap_or(0);
        let mut spec = super::from_hf(ckpt, cfg, naming.clone(), vocab, target.max_context, ARCH)?;
        // The assistant's head is a plain tied projection (no soft-cap in transformers).
        spec.final_softcap = None;
        // transformers masks the assistant's sliding layers bidirectionally with an inclusive
        // distance (|q - kv| <= window) flipped onto the newest cache entries: a query sees the
        // last window + 1 target positions.
        spec.window = spec.window.saturating_add(1);
        // Every assistant layer reads the target's cache of its type.
        let last_of = |sliding: bool| -> Result<usize, ModelError> {
            let j = (0..target.n_layers())
                .rev()
                .find(|&j| target.layers[j].sliding == sliding)
                .ok_or_else(|| bad(ARCH, "the target lacks a layer of each attention type"))?;
            Ok(target.layers[j].kv_source.unwrap_or(j))
        };
        for l in spec.layers.iter_mut() {
            let src = last_of(l.sliding)?;
            let t = &target.layers[src];
            if t.head_dim != l.head_dim {
                return Err(bad(
                    ARCH,
                    format!(
                        "head dim {} does not match the target's {}",
                        l.head_dim, t.head_dim
                    ),
                ));
            }
            l.kv_source = Some(src);
            l.n_kv_heads = t.n_kv_heads;
            l.k_eq_v = false;
        }
        let ld = Loader {
            ckpt,
            backend: &*backend,
            naming,
        };
        let weights = GemmaWeights::load(&ld, &spec)?;
        let ha = spec.hidden;
        let pre_projection = ld.matrix("pre_projection.weight", ha, 2 * backbone_hidden)?;
        let post_projection = ld.matrix("post_projection.weight", backbone_hidden, ha)?;
        Ok(Gemma4Assistant {
            model: GemmaModel::new(spec, weights, backend),
            pre_projection,
            post_projection,
            backbone_hidden,
        })
    }

    /// One draft step: `token` is the last token (not yet in the target's cache), `hidden` the
    /// state described in the module docs, `pos` the position of `token`. Attends over all
    /// `target.len()` cached positions (sliding layers: the last `window` of them).
    pub fn draft(
        &self,
        target: &GemmaSession<B>,
        token: u32,
        hidden: &B::Tensor,
        pos: usize,
    ) -> Result<Draft<B>, ModelError> {
        let be = &*self.model.backend;
        let tm = &**target.model();
        let state = target.state().ok_or(ModelError::Empty)?;
        if token as usize >= tm.spec.vocab {
            return Err(ModelError::BadToken {
                id: token,
                vocab: tm.spec.vocab,
            });
        }
        let kv_len = crate::model::Session::len(target);
        if kv_len == 0 {
            return Err(ModelError::Empty);
        }
        // the token's step (its embedding, the queries' RoPE) and the step the queries attend
        // from (the target's last cached position)
        let step = |pos| {
            StepPlan::single(&[token], pos, LogitRows::Last)
                .and_then(|p| be.step(p))
                .map_err(me)
        };
        let (at_token, at_end) = (step(pos)?, step(kv_len - 1)?);
        let e = be
            .embed(&tm.weights.embed, &at_token, tm.spec.embed_scale)
            .map_err(me)?;
        let xh = be.concat_cols(&[&e, hidden]).map_err(me)?;
        let mut x = be.linear(&xh, &self.pre_projection).map_err(me)?;
        let m = &self.model;
        for (i, l) in m.spec.layers.iter().enumerate() {
            let src = l
                .kv_source
                .ok_or_else(|| bad(ARCH, format!("layer {i} has no target layer")))?;
            let cache = state.caches[src]
                .as_ref()
                .ok_or_else(|| bad(ARCH, format!("target layer {src} has no cache")))?;
            let h = m.rms(&x, &m.weights.layers[i].attn_norm)?;
            let q = m.query(i, &h, &at_token)?;
            x = m.attend(i, &x, &q, cache, &at_end, l.n_kv_heads)?;
            x = m.ffn(i, &x, None)?;
        }
        let y = m.rms(&x, &m.weights.final_norm)?;
        let logits = m.logits(&y)?;
        let hidden = be.linear(&y, &self.post_projection).map_err(me)?;
        Ok(Draft { logits, hidden })
    }
}
