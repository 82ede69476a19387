pub(crate) mod backend_moe;
pub(crate) mod moe_fused;
pub(crate) mod moe_grouped;
pub(crate) mod pipeline;
