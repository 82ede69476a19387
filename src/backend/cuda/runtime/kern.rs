//! A resolved kernel ([`Kern`]: spec + loaded function, so a launch does no lookup and no
//! string work), its secondary entries ([`KernQ8`], [`KernEntry`]), the argument checks every
//! launch shares, the launch itself, strided 2-D copies and the block sizes of the weight formats.

use crate::kernels::Entry;
use cudarc::driver::{sys, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use super::buf::DevPtr;
use super::error::{drv, CudaError};
use super::types::Q8Ptrs;
use crate::backend::cuda::CudaDevice;
use crate::kernels::{KernelSpec, Op, Quant};

/// A resolved kernel instance: its spec and its loaded main function.
#[derive(Debug, Clone)]
pub struct Kern {
    pub spec: &'static KernelSpec,
    pub f: CudaFunction,
}

/// The `<name>__q8` entry of an rmsnorm / glu instance: the same kernel that also writes the
/// int8 side-car of its output (extra `signed char* xq, float2* xds` arguments). Only
/// [`CudaDevice::kern_q8`] makes one, so a launch can never pair the wrong argument list with
/// the wrong entry.
#[derive(Debug, Clone)]
pub struct KernQ8(Kern);

impl KernQ8 {
    pub fn spec(&self) -> &'static KernelSpec {
        self.0.spec
    }
    /// The loaded `__q8` entry.
    pub(crate) fn kern(&self) -> &Kern {
        &self.0
    }
}

pub(in crate::backend::cuda) fn invalid(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

pub(in crate::backend::cuda) fn int(
    op: &'static str,
    what: &str,
    v: usize,
) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| invalid(op, format!("{what} = {v} exceeds i32")))
}

pub(in crate::backend::cuda) fn grid(op: &'static str, n: usize) -> Result<u32, CudaError> {
    u32::try_from(n)
        .ok()
        .filter(|&b| b > 0 && b < (1u32 << 31))
        .ok_or_else(|| invalid(op, format!("grid of {n} blocks is out of range")))
}

pub(in crate::backend::cuda) fn expect(
    k: &Kern,
    ops: &[Op],
    op: &'static str,
) -> Result<(), CudaError> {
    if ops.contains(&k.spec.key.op) {
        Ok(())
    } else {
        Err(invalid(
            op,
            format!("instance {} is not a {op} kernel", k.spec.name),
        ))
    }
}

/// The raw `(xq, xds)` kernel arguments of an optional int8 side-car over `len` values written
/// in groups of 32 that never straddle a `unit` (a norm group or an output row): null pointers
/// without one; with one, `unit % 32 == 0` and room for `len` int8 values and `len / 32` pairs.
pub(crate) fn q8_args(
    op: &'static str,
    q8: Option<Q8Ptrs>,
    len: usize,
    unit: usize,
) -> Result<(u64, u64), CudaError> {
    let Some((q, ds)) = q8 else {
        return Ok((0, 0));
    };
    if unit == 0 || unit % 32 != 0 || len % unit != 0 || q.len() < len || ds.len() < len / 16 {
        return Err(invalid(
            op,
            format!(
                "side-car of {} int8 / {} floats for {len} values in groups of {unit}",
                q.len(),
                ds.len()
            ),
        ));
    }
    Ok((q.raw(), ds.raw()))
}

impl CudaDevice {
    /// Resolve and load the best instance of `(op, quant, batch)` for this device.
    pub fn kern(
        &self,
        op: Op,
        quant: Quant,
        batch: crate::kernels::BatchBucket,
    ) -> Result<Kern, CudaError> {
        let spec = self.resolve(op, quant, crate::kernels::HeadDim::Any, batch)?;
        Ok(Kern {
            spec,
            f: self.function(spec)?,
        })
    }

    /// The side-car entry (`__q8`) of `k`, an rmsnorm or glu instance.
    pub fn kern_q8(&self, k: &Kern) -> Result<KernQ8, CudaError> {
        expect(k, &[Op::RmsNorm, Op::Geglu, Op::Swiglu], "kern_q8")?;
        Ok(KernQ8(Kern {
            spec: k.spec,
            f: self.function_entry(k.spec, Entry::Q8)?,
        }))
    }

    pub(in crate::backend::cuda) fn go(
        &self,
        k: &Kern,
        cfg: LaunchConfig,
        args: &[&dyn ArgPush],
    ) -> Result<(), CudaError> {
        let mut b = self.stream().launch_builder(&k.f);
        for a in args {
            a.push(&mut b);
        }
        // SAFETY: every caller passes the argument list of its kernel's signature (stated at the
        // call) and has checked that each pointer addresses what the kernel reads and writes.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", k.spec.name)))?;
        Ok(())
    }
}

/// One kernel argument (a pointer as `u64`, or a scalar).
pub(in crate::backend::cuda) trait ArgPush {
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>);
}
macro_rules! arg_push {
    ($($t:ty),*) => {$(
        impl ArgPush for $t {
            fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>) {
                b.arg(self);
            }
        }
    )*};
}
arg_push!(u64, i64, i32, f32);

/// Copy `height` rows of `width` values from `src` (row pitch `src_pitch` values) to `dst` (row
/// pitch `dst_pitch`): stream-ordered and capturable (a memcpy node in a CUDA graph).
pub fn copy_2d(
    stream: &CudaStream,
    dst: DevPtr<f32>,
    dst_pitch: usize,
    src: DevPtr<f32>,
    src_pitch: usize,
    width: usize,
    height: usize,
) -> Result<(), CudaError> {
    const OP: &str = "copy_2d";
    if width == 0 || height == 0 {
        return Ok(());
    }
    let span = |pitch: usize| (height - 1) * pitch + width;
    if width > src_pitch
        || width > dst_pitch
        || src.len() < span(src_pitch)
        || dst.len() < span(dst_pitch)
    {
        return Err(invalid(
            OP,
            format!(
                "{height} rows of {width} from {} (pitch {src_pitch}) into {} (pitch {dst_pitch})",
                src.len(),
                dst.len()
            ),
        ));
    }
    const F: usize = std::mem::size_of::<f32>();
    let cp = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src.raw(),
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch * F,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst.raw(),
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch * F,
        WidthInBytes: width * F,
        Height: height,
    };
    super::buf::bind(stream)?;
    // SAFETY: both pointers address the spans checked above (their contract); the descriptor
    // is read by the driver during the call.
    unsafe { sys::cuMemcpy2DAsync_v2(&cp, stream.cu_stream()) }
        .result()
        .map_err(drv("strided device->device copy"))
}

/// (elements, bytes) of one block of a GEMV/GEMM weight format.
pub fn weight_block(q: Quant) -> Option<(usize, usize)> {
    Some(match q {
        Quant::F32 => (1, 4),
        Quant::F16 | Quant::Bf16 => (1, 2),
        Quant::Fp8E4m3 => (1, 1),
        Quant::Q8_0 | Quant::Q8_0R => (32, 34),
        Quant::Q4_0 | Quant::Q4_0R => (32, 18),
        Quant::Q5_0 => (32, 22),
        Quant::Q4K | Quant::Q4KR => (256, 144),
        Quant::Q6K | Quant::Q6KR => (256, 210),
        Quant::NvFp4 => return None,
    })
}

/// A loaded secondary entry of an instance. Only [`CudaDevice::kern_entry`] makes one; each
/// launch helper checks the op and the entry, so a launch never pairs an argument list with the
/// wrong entry.
#[derive(Debug, Clone)]
pub struct KernEntry {
    pub(in crate::backend::cuda) kern: Kern,
    pub(in crate::backend::cuda) entry: Entry,
}

impl KernEntry {
    pub fn spec(&self) -> &'static crate::kernels::KernelSpec {
        self.kern.spec
    }
    pub fn entry(&self) -> Entry {
        self.entry
    }
}

impl CudaDevice {
    /// Load the entry `e` of instance `k`.
    pub fn kern_entry(&self, k: &Kern, e: Entry) -> Result<KernEntry, CudaError> {
        Ok(KernEntry {
            kern: Kern {
                spec: k.spec,
                f: self.function_entry(k.spec, e)?,
            },
            entry: e,
        })
    }
}
