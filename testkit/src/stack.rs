//! The local stack's coordinates: from the environment, else from the env file
//! `make up` writes (`~/.cache/oxbow/stack/env`, or under `OXBOW_CACHE`).

use std::path::PathBuf;

/// Oxbow's cache (`OXBOW_CACHE`, default `~/.cache/oxbow`): the stack, its tools, the
/// build.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("OXBOW_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/oxbow")
        })
}

/// A variable from the environment, or else from `make up`'s env file.
pub fn stack_var(name: &str) -> String {
    stack_var_opt(name).unwrap_or_else(|| {
        panic!(
            "{name} is neither set nor in {}: these tests need the local stack (`make up`; `make test` does it)",
            cache_dir().join("stack/env").display()
        )
    })
}

/// [`stack_var`], or `None` when neither the environment nor the env file has it.
pub fn stack_var_opt(name: &str) -> Option<String> {
    if let Ok(v) = std::env::var(name)
        && !v.is_empty()
    {
        return Some(v);
    }
    let text = std::fs::read_to_string(cache_dir().join("stack/env")).ok()?;
    text.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim_matches('"').to_string())
}

/// Kafka's bootstrap servers for the test process.
pub fn kafka_bootstrap() -> String {
    stack_var("KAFKA_BOOTSTRAP")
}
