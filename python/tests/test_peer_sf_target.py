"""python/peer/sf_train.py's target: SpecForge's side of the quality harness must run the target
the user gave, as its config names it. A Llama target loaded as a Qwen3 model would get q/k norms
it does not have (initialised, not read), and SpecForge would train on other hidden states than
dflash-top's."""

import os
import sys

import pytest

from conftest import REPO

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(REPO, "python", "peer"))

import sf_train  # noqa: E402


def tiny_llama(path):
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path, safe_serialization=True)
    return model


def test_a_llama_target_runs_as_llama_with_its_own_hidden_states(tmp_path):
    want = tiny_llama(tmp_path)
    got = sf_train.load_target(str(tmp_path), torch.float32, torch.device("cpu"))
    assert type(got).__name__ == "LlamaForCausalLM"
    assert not any(p.requires_grad for p in got.parameters())
    ids = torch.tensor([[1, 5, 9, 3, 7, 2]])
    with torch.no_grad():
        a = want(ids, output_hidden_states=True).hidden_states
        b = got(ids, output_hidden_states=True).hidden_states
    assert len(a) == len(b) == 3
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
