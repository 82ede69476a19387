//! The Gemma decoder shared by Gemma 3 and Gemma 4 (and the Gemma 4 MTP head's layers): one
//! forward pass over the `Backend` trait, configured by a resolved `spec::GemmaSpec`. The
//! per-family modules (`model::gemma3`, `model::gemma4`) turn checkpoint metadata into a spec.

pub mod config;
pub mod decoder;
pub mod layers;
pub mod moe;
pub mod session;
pub mod spec;
pub mod weights;

pub use decoder::GemmaModel;
pub use session::{ring_slots, GemmaSession};

use std::sync::Arc;

use crate::backend::Backend;
use crate::model::ModelError;
use crate::weights::Checkpoint;

/// Load the weights `spec` describes from `ckpt` onto `backend` and build the decoder: the one
/// path behind every Gemma generation's loader.
pub fn build<B: Backend>(
    ckpt: &Checkpoint,
    spec: GemmaSpec,
    backend: Arc<B>,
) -> Result<Arc<GemmaModel<B>>, ModelError> {
    let ld = weights::Loader {
        ckpt,
        backend: &*backend,
        naming: spec.naming.clone(),
    };
    let weights = layers::GemmaWeights::load(&ld, &spec)?;
    Ok(Arc::new(GemmaModel::new(spec, weights, backend)))
}

/// [`build`], then the context capped by `opts`' KV budget (measured after the weights are
/// uploaded).
pub fn build_with<B: Backend>(
    ckpt: &Checkpoint,
    mut spec: GemmaSpec,
    backend: Arc<B>,
    opts: &crate::model::registry::LoadOptions,
) -> Result<Arc<GemmaModel<B>>, ModelError> {
    let ld = weights::Loader {
        ckpt,
        backend: &*backend,
        naming: spec.naming.clone(),
    };
    let weights = layers::GemmaWeights::load(&ld, &spec)?;
    let (full, sliding) = spec.kv_elems_split();
    let slots = ring_slots(spec.window, crate::model::common::prefill_chunk());
    spec.max_context = opts.cap_context_ring(
        spec.max_context,
        backend.kv_bytes(full),
        backend.kv_bytes(sliding),
        slots,
    )?;
    Ok(Arc::new(GemmaModel::new(spec, weights, backend)))
}
pub use spec::{GemmaSpec, LayerSpec, MoeSpec, Naming, NormForm};
