//! Every integration test but five, as the modules of one test binary: one link of the
//! library and one instantiation of its generic kernels instead of fifty (`make test` spent
//! about twelve of its seventeen minutes compiling and linking separate binaries). Each module
//! is the file of its name in this directory and runs alone with
//! `cargo test --profile checked --test suite NAME::` (the profile `make test` uses).
//!
//! Not here, each a binary of its own (Cargo.toml): tests/accounting.rs and tests/fuzz.rs,
//! which install a global allocator that counts what their own tests allocate, and
//! tests/budget.rs and tests/hostile.rs, which hold a child's peak RSS to a bound: Linux
//! counts in a child's peak the memory its parent had mapped when it forked (the parent's
//! peak, for a `vfork`-style spawn), so the parent must stay small — not a process running
//! fifty files' tests at once; and tests/purgeable.rs, which moves its process into a memory
//! cgroup and squeezes it (beside other tests, their allocations took the squeeze).

mod common;
mod quant_util;

mod boot;
mod cache_replay;
mod caller_stack;
mod chat;
mod chat_template;
mod cli;
mod container;
mod cpus;
mod deps;
mod faults;
mod hotlist;
mod integer_accuracy;
mod integer_model;
mod kda_golden;
mod kernels;
mod kernels_integer;
mod kernels_mxfp4;
mod malformed;
mod mkcpio;
mod module_graph;
mod oracle_dense;
mod oracle_extra;
mod oracle_fp8;
mod oracle_glm;
mod oracle_gptoss;
mod oracle_isa;
mod oracle_mla;
mod oracle_moe;
mod oracle_qwen3_next;
mod plan;
mod prefill_outputs;
mod public_api;
mod quant_format;
mod quant_gate;
mod ram;
mod routing_trace;
mod serve;
mod serve_load;
mod serve_openai;
mod session;
mod soundness;
mod static_binary;
mod stories;
mod template_cli;
mod template_language;
mod template_tokenize;
mod tokenizer_hf;
mod tokenizer_props;
mod tokenizer_tiktoken;
