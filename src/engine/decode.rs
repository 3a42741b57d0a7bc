//! Decoding with the target: its greedy (or sampled) continuation of a prompt, one token at a
//! time through the KV cache, until an end-of-sequence token or a length limit.

use super::qwen3::{KvCache, Qwen3Target};
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
/// None when `stop` said so between two tokens. Sampling draws from libtorch's generator: seed it
/// (`tch::manual_seed`) once for a reproducible file.
pub fn continuation(
    model: &Qwen3Target,
    prompt: &[i64],
    eos: &[i64],
    how: Decoding,
    device: Device,
    stop: &mut dyn FnMut(usize) -> bool,
) -> Option<Vec<i64>> {
    let _no_grad = tch::no_grad_guard();
    let mut cache = KvCache::default();
    let mut out = Vec::with_capacity(how.max_new_tokens);
    let mut input = Tensor::from_slice(prompt).to_device(device).unsqueeze(0);
    while out.len() < how.max_new_tokens {
        if stop(out.len()) {
            return None;
        }
        let logits = model.logits(&input, &mut cache); // [1, n, vocab]
        let last = logits.select(1, -1).squeeze_dim(0); // [vocab]
        let next = pick(&last, how.temperature);
        out.push(next);
        if eos.contains(&next) {
            break;
        }
        input = Tensor::from_slice(&[next]).to_device(device).unsqueeze(0);
    }
    Some(out)
}

// logits [vocab] f32 -> token id
fn pick(logits: &Tensor, temperature: f64) -> i64 {
    let t = if temperature > 0.0 {
        (logits / temperature)
            .softmax(-1, Kind::Float)
            .multinomial(1, false)
    } else {
        logits.argmax(-1, false)
    };
    t.reshape([-1]).int64_value(&[0])
}
