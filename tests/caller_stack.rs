//! The thread an embedder evaluates on: docs/API.md asks for 1 MiB of stack, and the prefill
//! GEMMs keep their buffers on the caller's stack (it is participant 0 of the compute pool).

use crate::common;
use common::*;
use waste::{Model, Options};

/// What docs/API.md promises an embedder: a model evaluates from a thread with 1 MiB of
/// stack. The prompt (128 tokens of a SmolLM2-135M-shaped model) takes every instruction set's
/// prefill GEMM, whose buffers are the largest on the caller's stack; a stack too small would
/// abort this test binary (a stack overflow), which fails it. Not in tests/budget.rs, whose
/// children's peak RSS would count this process's models (tests/suite.rs).
#[test]
fn a_prefill_runs_on_a_thread_with_one_mib_of_stack() {
    let model = temp_dir("small-stack").join("m");
    let cfg = waste::tools::random::preset("smollm2-135m").unwrap();
    waste::tools::random::write_checkpoint(&model, &cfg, waste::format::dtype::DType::BF16, 5).unwrap();
    let prompt: Vec<u32> = (0..128).map(|i| 1 + i * 7).collect();
    for isa in waste::kernels::Isa::ALL.into_iter().filter(|i| i.supported()) {
        let (model, prompt) = (model.clone(), prompt.clone());
        let logits = std::thread::Builder::new().stack_size(1 << 20).spawn(move || {
            let mut m = Model::open(&model, &Options { threads: 2, isa: Some(isa), ..Options::default() }).unwrap();
            assert_eq!(m.info().isa, isa.name());
            m.eval(&prompt).unwrap().to_vec()
        }).unwrap().join().unwrap_or_else(|_| panic!("{}: the evaluation panicked", isa.name()));
        assert_finite(isa.name(), &logits);
        println!("{}: 128 tokens evaluated on a 1 MiB stack", isa.name());
    }
    let _ = std::fs::remove_dir_all(model.parent().unwrap());
}
