//! The `waste` command: a client of the library's public API (see `cli`).

mod cli;
mod serve;

fn main() {
    // `args_os`: an argument that is not UTF-8 (a path may be any bytes) must not panic here;
    // the parser decides what each argument may be.
    std::process::exit(cli::main(std::env::args_os().skip(1).collect()));
}
