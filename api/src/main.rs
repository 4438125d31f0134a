//! The `tidemark` binary: parse the command line and hand over to the library.

fn main() -> std::process::ExitCode {
    tidemark_api::cli::main()
}
