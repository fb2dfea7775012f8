//! `oxbow-worker`: runs a StreamApp's tasks. Standalone (`--instance N --instances M`)
//! against any Kafka, or as a pod the operator manages. The command line is
//! [`oxbow_worker::cli`].

// glibc's malloc and free took about a fifth of the worker's CPU in W1 (a perf profile
// in docs/benchmarks.md): every record allocates its key, value and outputs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    oxbow_worker::cli::main_with(Vec::new())
}
