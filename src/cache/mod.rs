//! The expert cache: a byte-bounded set of slots holding routed-expert records read from disk,
//! with the I/O that fills them and the memory plan that sizes them. (Filled in by the
//! mixture-of-experts work; dense models do not use it.)

pub mod plan;
pub mod ram;
