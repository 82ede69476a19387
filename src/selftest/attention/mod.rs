pub(crate) mod attn_decode;
pub(crate) mod attn_prefill;
pub(crate) mod attn_prep;
pub(crate) mod backend_attend;
pub(crate) mod backend_kv;
pub(crate) mod backend_qkv;
pub(crate) mod backend_qkv_prep;
pub(crate) mod kv_write;
