//! Backend errors.

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{op}: shape mismatch: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("{op}: unsupported on the {backend} backend: {detail}")]
    Unsupported {
        op: &'static str,
        backend: &'static str,
        detail: String,
    },
    #[error("KV cache overflow: position {pos} exceeds capacity {capacity}")]
    KvOverflow { pos: usize, capacity: usize },
    #[error(transparent)]
    Quant(#[from] crate::quant::QuantError),
    #[error("{0}")]
    Device(String),
    /// Sampling found no logit above -inf (each NaN or -inf): the model's output is broken.
    #[error(
        "sample: no logit is finite (every one NaN or -inf): the model's output is broken, e.g. \
         by weights that are not finite"
    )]
    NoFiniteLogit,
}
