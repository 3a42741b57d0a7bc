//! Decoding with the target: its greedy (or sampled) continuations of prompts, one token a step
//! through the KV cache for a batch of prompts at once (padded on the left to one length), until
//! each writes an end-of-sequence token or reaches the length limit; a row that is done leaves the
//! batch. Greedy continuations are the ones each prompt gets alone.

use super::qwen3::{KvCache, Qwen3Target};
use crate::engine::model::shapes::Qwen3Config;
use tch::{Device, Kind, Tensor};

/// How the next token is picked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decoding {
    /// 0: greedy (argmax); above 0: sampled from softmax(logits / temperature).
    pub temperature: f64,
    /// New tokens at most.
    pub max_new_tokens: usize,
}

/// The tokens the target writes after `prompt` (an end token included when it wrote one), or
/// None when `stop` said so between two tokens (it is told the tokens made so far). Sampling
/// draws from libtorch's generator: seed it (`tch::manual_seed`) once for a reproducible file.
pub fn continuation(
    model: &Qwen3Target,
    prompt: &[i64],
    eos: &[i64],
    how: Decoding,
    device: Device,
    stop: &mut dyn FnMut(usize) -> bool,
) -> Option<Vec<i64>> {
    continuations(model, &[prompt], eos, how, device, stop).map(|mut v| v.remove(0))
}

/// `continuation` of every prompt of `prompts`, decoded together: one forward a step for the
/// rows still writing. `stop` is told the new tokens made so far, over all rows.
pub fn continuations(
    model: &Qwen3Target,
    prompts: &[&[i64]],
    eos: &[i64],
    how: Decoding,
    device: Device,
    stop: &mut dyn FnMut(usize) -> bool,
) -> Option<Vec<Vec<i64>>> {
    let _no_grad = tch::no_grad_guard();
    let mut outs: Vec<Vec<i64>> = vec![Vec::new(); prompts.len()];
    if prompts.is_empty() || how.max_new_tokens == 0 {
        return Some(outs);
    }
    let width = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let mut cache = KvCache::default();
    if prompts.iter().any(|p| p.len() != width) {
        cache.left_pad = prompts.iter().map(|p| (width - p.len()) as i64).collect();
    }
    // Padding takes token 0: no query sees it.
    let padded: Vec<i64> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(0, width - p.len()).chain(p.iter().copied()))
        .collect();
    let mut input = Tensor::from_slice(&padded)
        .to_device(device)
        .view([prompts.len() as i64, width as i64]);
    // Rows still writing: indices into `prompts`, in the cache's row order.
    let mut live: Vec<usize> = (0..prompts.len()).collect();
    let mut made = 0;
    loop {
        if stop(made) {
            return None;
        }
        let logits = model.next_logits(&input, &mut cache); // [rows, vocab]
        let next = pick(&logits, how.temperature);
        let mut keep = Vec::with_capacity(live.len());
        for (row, (&i, &token)) in live.iter().zip(&next).enumerate() {
            outs[i].push(token);
            made += 1;
            if !eos.contains(&token) && outs[i].len() < how.max_new_tokens {
                keep.push(row as i64);
            }
        }
        if keep.is_empty() {
            return Some(outs);
        }
        let tokens: Vec<i64> = keep.iter().map(|&r| next[r as usize]).collect();
        if keep.len() < live.len() {
            cache.keep_rows(&keep);
            live = keep.iter().map(|&r| live[r as usize]).collect();
        }
        input = Tensor::from_slice(&tokens)
            .to_device(device)
            .view([tokens.len() as i64, 1]);
    }
}

/// libtorch's threads for decoding `cfg` on `device`: one on the CPU for a small model (a token
/// at a time, the thread pool costs more than it gives: 9x slower on 2 busy cores at hidden 64).
pub fn set_threads_for(device: Device, cfg: &Qwen3Config) {
    if !device.is_cuda() && cfg.hidden_size < 1024 {
        tch::set_num_threads(1);
    }
}

// logits [rows, vocab] f32 -> a token id a row
fn pick(logits: &Tensor, temperature: f64) -> Vec<i64> {
    let t = if temperature > 0.0 {
        (logits / temperature)
            .softmax(-1, Kind::Float)
            .multinomial(1, false)
    } else {
        logits.argmax(-1, false)
    };
    Vec::<i64>::try_from(&t.reshape([-1]).to_device(Device::Cpu))
        .expect("argmax and multinomial give int64 ids")
}
