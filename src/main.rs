//! The `waste` command: a client of the library's public API (see `cli`).

mod cli;

fn main() {
    std::process::exit(cli::main(std::env::args().skip(1).collect()));
}
