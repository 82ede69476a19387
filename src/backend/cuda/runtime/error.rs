//! Errors of the CUDA runtime.

use crate::kernels::KernelError;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver or device (libcuda.so.1 not loadable, cuInit failed, or 0 devices)")]
    NoDevice,
    #[error("device compute capability {major}.{minor} is not supported (fucina needs sm_80+)")]
    UnsupportedDevice { major: u32, minor: u32 },
    #[error("CUDA driver error {context}: {source}")]
    Driver {
        context: String,
        #[source]
        source: cudarc::driver::DriverError,
    },
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Ptx(#[from] codegen::ptx::PtxError),
    #[error("kernel {name} targets {arch}, which a compute capability {major}.{minor} device cannot run")]
    WrongArch {
        name: &'static str,
        arch: codegen::SmArch,
        major: u32,
        minor: u32,
    },
    #[error("{op}: invalid launch: {detail}")]
    Invalid { op: &'static str, detail: String },
}

/// A raw driver call's result as a `CudaError::Invalid { op, detail: "what: code" }`.
pub(crate) fn cu_check(
    r: cudarc::driver::sys::CUresult,
    op: &'static str,
    what: &'static str,
) -> Result<(), CudaError> {
    if r == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Invalid {
            op,
            detail: format!("{what}: {r:?}"),
        })
    }
}

/// Attach context to a cudarc driver error.
pub(crate) fn drv(
    context: impl Into<String>,
) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError {
    let context = context.into();
    move |source| CudaError::Driver { context, source }
}

impl From<CudaError> for crate::backend::BackendError {
    /// Launch validation errors are shape errors of the op; everything else (driver, kernel
    /// lookup, PTX) is a device error.
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Invalid { op, detail } => crate::backend::BackendError::Shape { op, detail },
            other => crate::backend::BackendError::Device(format!("CUDA: {other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CudaError;
    use crate::backend::BackendError;

    #[test]
    fn errors_map_to_backend_errors() {
        let e: BackendError = CudaError::Invalid {
            op: "gemv",
            detail: "n=0".into(),
        }
        .into();
        assert!(matches!(e, BackendError::Shape { op: "gemv", .. }), "{e}");
        let e: BackendError = CudaError::NoDevice.into();
        assert!(
            matches!(&e, BackendError::Device(m) if m.contains("no CUDA driver")),
            "{e}"
        );
    }
}
