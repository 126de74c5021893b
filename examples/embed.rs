//! Embedding waste in another program: open a model under a memory budget, look at its plan,
//! tokenize, generate with a per-token callback, and keep one conversation across two turns.
//!
//! ```text
//! cargo run --release --example embed -- models/stories260K
//! ```
//!
//! Copy this file into a crate that depends on `waste`; it uses only the public API.

use std::io::Write;
use waste::{ErrorKind, GenerateParams, Model, Options};

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| "models/stories260K".to_string());
    if let Err(e) = run(&path) {
        // The library never prints: its errors come back to the host, which decides what to say.
        eprintln!("embed: {e}");
        std::process::exit(if e.kind() == ErrorKind::RamBudget { 2 } else { 1 });
    }
}

fn run(path: &str) -> waste::Result<()> {
    // 1. Open with a hard memory ceiling. Too small a budget is refused at open, with the
    //    smallest one that works in the message, never discovered later as an OOM.
    let opts = Options { budget: Some(64 << 20), threads: 1, ..Options::default() };
    let mut model = Model::open(path, &opts)?;

    // 2. The memory plan: what the model holds, part by part, within that budget.
    let plan = model.plan();
    let budget = model.budget();
    let info = model.info();
    println!("model:   {} ({}, {} layers, vocabulary {})", info.path.display(), info.architecture, info.layers, info.vocab);
    println!("plan:    trunk {} B, state {} B, scratch {} B, tokenizer {} B; floor {} B",
        plan.trunk_bytes, plan.state_bytes, plan.scratch_bytes, plan.tokenizer_bytes, plan.floor_bytes());
    println!("budget:  {} B ({:?}), expert cache {} B; in use now {} B",
        budget.bytes, budget.source, budget.expert_cache_bytes, model.memory_used());

    // 3. Tokenize: the prompt as the model sees it (with its beginning-of-sequence token).
    let prompt = model.tokenize_prompt("Once upon a time")?;
    println!("prompt:  {} tokens {:?}", prompt.len(), prompt);

    // 4. Generate, greedily, in a session of our own; the callback sees each token's text as
    //    it becomes final and may stop generation by returning false.
    let mut chat = model.new_session()?;
    let params = GenerateParams { max_tokens: 24, ..GenerateParams::greedy() };
    let mut stdout = std::io::stdout();
    print!("turn 1:  Once upon a time");
    let first = model.generate_in(&mut chat, &prompt, &params, |event| {
        print!("{}", event.text);
        stdout.flush().is_ok() // stop if the reader went away
    })?;
    println!("\n         [{} tokens, {:?}]", first.tokens, first.stop_reason);

    // 5. A second turn in the same session: the conversation so far plus new text. The state
    //    the session holds for the shared beginning is reused; only the new tokens are computed.
    let mut next = chat.tokens().to_vec();
    next.extend(model.tokenizer()?.tokenize(" One day,"));
    print!("turn 2:  ... One day,");
    let second = model.generate_in(&mut chat, &next, &params, |event| {
        print!("{}", event.text);
        stdout.flush().is_ok()
    })?;
    println!("\n         [{} tokens; {} of {} prompt tokens reused, {} computed]",
        second.tokens, second.reused_tokens, second.prompt_tokens, second.prefilled_tokens);
    if second.reused_tokens == 0 {
        return Err(waste::Error::new(ErrorKind::Arg, "the second turn reused nothing of the first"));
    }

    // 6. Cache statistics exist for a model whose experts stream from disk (a container).
    match model.cache_stats() {
        Some(stats) => println!("experts: {} hits, {} misses", stats.hits, stats.misses),
        None => println!("experts: none stream (a dense model)"),
    }
    Ok(())
}
