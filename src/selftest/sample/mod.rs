pub(crate) mod penalties;
pub(crate) mod sample;
