//! Tools built on the whole engine, behind the CLI's subcommands: checkpoint conversion to a
//! container ([`convert`]), quantization ([`quantize`]), random models for tests and
//! benchmarks ([`random`]), the float-versus-quantized comparison ([`compare`]) and the speed
//! measurement ([`bench`](mod@bench)). They sit above [`crate::format`], [`crate::model`] and
//! [`crate::kernels`], which never import them.

pub mod bench;
pub mod compare;
pub mod convert;
pub mod quantize;
pub mod random;
