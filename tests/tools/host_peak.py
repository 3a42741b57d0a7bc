"""Host memory two builds of dflash-top take, taking turns A B B A; the figure is each run's
peak resident set.

    python3 tests/tools/host_peak.py --make-qwen3 8b DIR     # a random Qwen3-8B checkpoint, bf16
    # a target's load onto a GPU (`generate`, 4 new tokens):
    python3 tests/tools/host_peak.py --a OLD --b NEW --target DIR --device cuda:0 --json OUT.json
    # a checkpoint's save (`train --headless`, one step, the drafter of --preset on the GPU):
    python3 tests/tools/host_peak.py --a OLD --b NEW --save-preset qwen3-8b --device cuda:0 \
        --json OUT.json

The checkpoint's tensors are random (normal, std 0.02) in Qwen3's layout and names, written in
shards of about 4 GB as Hugging Face writes them; only their bytes matter here.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

SHAPES = {
    # hidden, layers, heads, kv heads, intermediate, vocabulary (public Qwen3 configs)
    "0.6b": (1024, 28, 16, 8, 3072, 151936),
    "8b": (4096, 36, 32, 8, 12288, 151936),
}


def make_qwen3(size, out):
    import torch
    from safetensors.torch import save_file

    hidden, layers, heads, kv, inter, vocab = SHAPES[size]
    hd = 128
    os.makedirs(out, exist_ok=True)
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
        "head_dim": hd, "intermediate_size": inter, "vocab_size": vocab,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000, "max_position_embeddings": 40960,
        "tie_word_embeddings": size == "0.6b", "torch_dtype": "bfloat16", "hidden_act": "silu",
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    shapes = [("model.embed_tokens.weight", (vocab, hidden)), ("model.norm.weight", (hidden,))]
    if not config["tie_word_embeddings"]:
        shapes.append(("lm_head.weight", (vocab, hidden)))
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (heads * hd, hidden)),
            (p + "self_attn.k_proj.weight", (kv * hd, hidden)),
            (p + "self_attn.v_proj.weight", (kv * hd, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, heads * hd)),
            (p + "self_attn.q_norm.weight", (hd,)),
            (p + "self_attn.k_norm.weight", (hd,)),
            (p + "mlp.gate_proj.weight", (inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
        ]
    weight_map, shard, shard_bytes, n = {}, {}, 0, 0

    def flush():
        nonlocal shard, shard_bytes, n
        if shard:
            n += 1
            name = f"model-{n:05d}.safetensors"
            save_file(shard, os.path.join(out, name), metadata={"format": "pt"})
            weight_map.update({k: name for k in shard})
            shard, shard_bytes = {}, 0

    gen = torch.Generator().manual_seed(0)
    for name, shape in shapes:
        if len(shape) == 1:
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        shard[name] = t
        shard_bytes += t.numel() * 2
        if shard_bytes > 4 << 30:
            flush()
    flush()
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def peak_of(cmd, env):
    """Runs `cmd` alone; its peak resident set in GiB, its seconds and its last lines."""
    code = (
        "import resource,subprocess,sys,json,time;t=time.time();"
        "p=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
        "r=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss;"
        "print(json.dumps([r,time.time()-t,p.returncode,(p.stdout+p.stderr)[-600:]]))"
    )
    out = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True,
                         env=env, check=True)
    kb, secs, rc, tail = json.loads(out.stdout)
    return {"peak_gib": kb / (1 << 20), "seconds": secs, "exit": rc, "tail": tail}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--make-qwen3", nargs=2, metavar=("SIZE", "DIR"))
    ap.add_argument("--a")
    ap.add_argument("--b")
    ap.add_argument("--target")
    ap.add_argument("--save-preset")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.make_qwen3:
        t = time.time()
        make_qwen3(*args.make_qwen3)
        print(f"wrote {args.make_qwen3[1]} in {time.time() - t:.0f}s")
        return
    tmp = tempfile.mkdtemp()
    prompts = os.path.join(tmp, "p.jsonl")
    with open(prompts, "w") as f:
        f.write('{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8]}\n')
    runs = []
    for which in "ABBA":
        binary = args.a if which == "A" else args.b
        if args.save_preset:
            save_dir = os.path.join(tmp, f"save-{len(runs)}")
            cmd = [binary, "train", "--headless", "--preset", args.save_preset, "--steps", "1",
                   "--save-dir", save_dir, "--target-devices", args.device,
                   "--drafter-devices", args.device]
        else:
            cmd = [binary, "generate", "--target", args.target, "--data", prompts,
                   "--out", os.path.join(tmp, "g.jsonl"), "--max-new-tokens", "4",
                   "--device", args.device]
        r = peak_of(cmd, dict(os.environ))
        r["which"] = which
        runs.append(r)
        print(f"{which}: peak {r['peak_gib']:.2f} GiB, {r['seconds']:.1f} s, exit {r['exit']}",
              flush=True)
        if r["exit"] != 0:
            print(r["tail"])
        if args.save_preset:
            subprocess.run(["rm", "-rf", save_dir], check=False)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": args.target, "save_preset": args.save_preset,
                       "device": args.device, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
