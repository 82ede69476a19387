//! [`CudaBackend`]: the `Backend` trait on one CUDA device. Models run on it unchanged.

use std::sync::Arc;

use super::buf::Pool;
use super::types::KvType;
use super::CudaDevice;

/// The CUDA backend: a device, its memory pool and the options the models' ops need.
pub struct CudaBackend {
    pub dev: Arc<CudaDevice>,
    pub pool: Arc<Pool>,
    pub kv_type: KvType,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("dev", &self.dev)
            .field("kv_type", &self.kv_type)
            .finish()
    }
}
