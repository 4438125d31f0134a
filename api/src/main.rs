//! The `tidemark` binary: parse the command line and hand over to the library.

/// mimalloc instead of glibc malloc: the folds and the writer allocate many small, short-lived
/// buffers, and glibc spent a fifth of a rebuild consolidating and unlinking them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tidemark_api::cli::main()
}
