//! Mixture of experts: routing and the selected experts' MLPs, as a decode step of three fused
//! launches, a device-grouped prefill, or a prefill by expert.

pub mod by_expert;
pub mod decode;
pub mod grouped;
pub mod launch;
pub mod launch_fused;
pub mod pipeline;
