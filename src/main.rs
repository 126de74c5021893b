//! The `waste` command: a client of the library's public API (see `cli`).

mod cli;
mod serve;

fn main() {
    // `args_os`: an argument that is not UTF-8 (a path may be any bytes) must not panic here;
    // the parser decides what each argument may be.
    let args = std::env::args_os().skip(1).collect();
    // As PID 1 (booted as /init), the arguments are the kernel command line's, and the process
    // must power the machine off rather than exit (see `cli::init`).
    if cli::init::is_init() {
        cli::init::main(args);
    }
    std::process::exit(cli::main(args));
}
