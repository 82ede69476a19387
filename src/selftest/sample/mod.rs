pub(crate) mod draw;
pub(crate) mod penalties;
