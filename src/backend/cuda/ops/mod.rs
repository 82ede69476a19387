//! Typed launches of the generated kernels, one folder per op family. Each launch validates its
//! shapes against the buffers (an error, never a panic) and states the kernel signature it
//! matches; the backend (`../backend`) composes them into the `Backend` traits' ops.

pub mod attention;
pub mod elementwise;
pub mod linear;
pub mod moe;
