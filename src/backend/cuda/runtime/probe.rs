//! Is there a usable CUDA driver and at least one device? Answered without cudarc.

use std::sync::OnceLock;

/// Library names tried, in order (the versioned soname first, as installed by the driver).
const LIBCUDA_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// True when libcuda can be loaded, `cuInit(0)` succeeds and it reports at least one device.
/// Cached after the first call. Safe to call on machines without a GPU or driver.
pub fn cuda_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(probe)
}

fn probe() -> bool {
    for name in LIBCUDA_NAMES {
        // SAFETY: loading libcuda runs its initialisers, which are designed to be loaded into
        // any process; we pass a constant library name, not user input.
        let Ok(lib) = (unsafe { libloading::Library::new(*name) }) else {
            continue;
        };
        type CuInit = unsafe extern "C" fn(u32) -> i32;
        type CuDeviceGetCount = unsafe extern "C" fn(*mut i32) -> i32;
        // SAFETY: the symbol types match the CUDA driver API declarations
        // (`CUresult cuInit(unsigned int)`, `CUresult cuDeviceGetCount(int*)`; CUresult is a
        // C enum, i32-sized).
        let syms = unsafe {
            (
                lib.get::<CuInit>(b"cuInit\0"),
                lib.get::<CuDeviceGetCount>(b"cuDeviceGetCount\0"),
            )
        };
        let (Ok(init), Ok(count)) = syms else {
            continue;
        };
        // SAFETY: cuInit takes flags (must be 0); cuDeviceGetCount writes one int through a
        // valid pointer. Both are safe to call repeatedly and from any thread.
        let n = unsafe {
            if init(0) != 0 {
                continue;
            }
            let mut n = 0i32;
            if count(&mut n) != 0 {
                continue;
            }
            n
        };
        // Keep the library loaded for the process lifetime: cudarc will dlopen it again.
        std::mem::forget(lib);
        return n > 0;
    }
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn probe_never_panics_and_is_stable() {
        let a = super::cuda_available();
        assert_eq!(a, super::cuda_available());
    }
}
