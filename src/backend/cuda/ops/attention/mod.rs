//! The paged KV cache and attention over it: K/V writes, the attention input (`attn_prep`, and
//! its fusion with the q|k|v projection), prefill and decode attention.

pub mod arena;
pub mod cache;
pub mod decode;
pub mod kv;
pub mod launch;
pub mod prep;
pub mod qkv_prep;
