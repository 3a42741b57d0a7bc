//! The CUDA caching allocator's settings for this process: expandable segments, unless the user
//! set `PYTORCH_CUDA_ALLOC_CONF` (or `PYTORCH_ALLOC_CONF`) themselves. With fixed segments a
//! run near a card's size fails on blocks freed but too fragmented to reuse: qwen3-32b with an
//! FP8 target and bf16 moments on one 80 GB H100 ran out with 74.0 GiB allocated and 3.9 GiB
//! reserved unused; the same build with expandable segments trained at a peak of 75.0 GiB
//! (docs/performance.md, docs/runs/qwen3-32b-fp8-bf16-states-h100.txt). libtorch reads the
//! variable when CUDA is first used, so this runs before anything else (src/main.rs).

/// The variable libtorch's CUDA allocator reads, and the value set where the user set none.
pub const VAR: &str = "PYTORCH_CUDA_ALLOC_CONF";
pub const EXPANDABLE: &str = "expandable_segments:True";

/// The value to set, given the two variables as the user left them: none where either is set.
pub fn default_for(cuda_conf: Option<&str>, alloc_conf: Option<&str>) -> Option<&'static str> {
    match (cuda_conf, alloc_conf) {
        (None, None) => Some(EXPANDABLE),
        _ => None,
    }
}

/// Sets the allocator's default for this process; call before any thread starts and before
/// CUDA is used.
pub fn install_default() {
    let get = |name| std::env::var(name).ok();
    let (cuda_conf, alloc_conf) = (get(VAR), get("PYTORCH_ALLOC_CONF"));
    if let Some(value) = default_for(cuda_conf.as_deref(), alloc_conf.as_deref()) {
        std::env::set_var(VAR, value);
    }
}

/// What the allocator runs with, for `bench engine`'s line: the variable's value, or "default".
pub fn describe() -> String {
    std::env::var(VAR)
        .or_else(|_| std::env::var("PYTORCH_ALLOC_CONF"))
        .unwrap_or_else(|_| "default".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expandable segments where the user said nothing; their own setting, of either name, wins
    /// (a `expandable_segments:False` turns them off for a side-by-side run).
    #[test]
    fn expandable_segments_unless_the_user_set_the_allocator() {
        assert_eq!(default_for(None, None), Some(EXPANDABLE));
        assert_eq!(default_for(Some("expandable_segments:False"), None), None);
        assert_eq!(default_for(None, Some("max_split_size_mb:128")), None);
    }
}
