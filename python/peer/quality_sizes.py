"""The sizes of python/peer/quality.py: for each, the chat language and target, the data's shape,
both trainers' primary settings and their sweep grids, the seeds, the target tokens a run reads,
and (`real`) what replaces them with --target-dir."""

SIZES = {
    # The CPU size: a few minutes on two cores, in `make test`.
    "ci": {
        "lang": {"words": 128, "topics": 2, "fillers": 8, "seed": 1},
        "target": {
            "shape": {
                "hidden": 64,
                "intermediate": 192,
                "layers": 6,
                "heads": 4,
                "kv_heads": 2,
                "head_dim": 16,
            },
            # 100 steps learnt the topics' maps but not to start at the user's seed word (10 of
            # 165 replies did, 7 distinct replies); at 300 every reply of a sample of 30 did, but
            # on another host's float kernels 161 of 170 (under check_data's 95%); at 400, 170.
            "steps": 400,
            "batch": 16,
            "lr": 3e-3,
            "noise": 0.05,
        },
        "buckets": [(8, 16), (20, 40), (50, 100)],
        "max_turns": 2,
        "budget": 220,
        "max_length": 256,
        "train_convs": 96,
        "eval_convs": 16,
        "held_share": 0.2,
        "drafter_layers": 2,
        "block": 16,
        # SpecForge's anchors per conversation (its num_anchors).
        "anchors": 64,
        # Three optimizer steps a packed row of 256 tokens: about one conversation (87 tokens)
        # a step, as SpecForge's batch 1 takes (docs/quality.md: 1 step a row learnt less per
        # token than SpecForge at batch 1; 3 learnt more).
        "ours": {"seq_len": 256, "anchors": 64, "budget": "per-row", "steps_per_batch": 3,
                 "lr": 3e-3},
        # SpecForge 0.2.0's default batch: one conversation a step.
        "sf": {"batch": 1, "lr": 3e-3},
        "sweep": {
            "ours": {"step": [{"steps_per_batch": 1}, {"steps_per_batch": 3},
                              {"steps_per_batch": 6}, {"seq_len": 128, "anchors": 32},
                              {"steps_per_batch": "doc", "budget": "per-doc"}],
                     "lr": [1e-3, 3e-3, 1e-2]},
            "sf": {"step": [{"batch": 1}, {"batch": 2}, {"batch": 4}], "lr": [1e-3, 3e-3, 1e-2]},
        },
        "seeds": 3,
        "tokens": 48 * 256,
        "eval_max_new": 128,
        "floor_prompts": 16,
        "threads": 1,
        # --target-dir: prompts of real text (real_prompts.py) and the target's replies.
        "real": {"train_prompts": 64, "eval_prompts": 16, "max_new": 48},
    },
    # The GPU size (one H200): replies of 50 to 1,500 tokens, up to 3 turns, rows of 3,072.
    "gpu": {
        "lang": {"words": 1600, "topics": 4, "fillers": 32, "seed": 1},
        "target": {
            "shape": {
                "hidden": 512,
                "intermediate": 1536,
                "layers": 8,
                "heads": 8,
                "kv_heads": 4,
                "head_dim": 64,
            },
            "steps": 800,
            "batch": 16,
            "lr": 1e-3,
            "noise": 0.03,
        },
        "buckets": [(50, 100), (200, 400), (800, 1500)],
        "max_turns": 3,
        "budget": 2900,
        "max_length": 3072,
        "train_convs": 480,
        "eval_convs": 128,
        "held_share": 0.2,
        "drafter_layers": 5,
        "block": 16,
        "anchors": 512,
        "ours": {"seq_len": 3072, "anchors": 512, "budget": "per-row", "steps_per_batch": 4,
                 "lr": 6e-4},
        "sf": {"batch": 1, "lr": 6e-4},
        "sweep": {
            "ours": {"step": [{"steps_per_batch": 1}, {"steps_per_batch": 4},
                              {"steps_per_batch": 8}],
                     "lr": [1e-3, 3e-3, 1e-2]},
            "sf": {"step": [{"batch": 1}, {"batch": 2}, {"batch": 4}], "lr": [1e-3, 3e-3, 1e-2]},
        },
        "seeds": 3,
        # 32 steps: training still going on. At 600 steps (1.84M tokens) every trainer reaches the
        # data's ceiling (docs/quality.md) and the table can no longer tell them apart.
        "tokens": 32 * 3072,
        "eval_max_new": 384,
        "floor_prompts": 8,
        "threads": None,
        # --target-dir (SmolLM2-135M-Instruct, docs/quality.md): docstring prompts of ~100-300
        # tokens and replies up to 512; the keys after max_new replace the size's own.
        # 640 prompts made 181-183K target tokens on an H100 (283 a conversation, 219
        # labelled); a run reads 262K (1.45 epochs): SpecForge at batch 1 in 55-126 s a seed
        # there, ours in 4-34 s. Measured by replay (quality_replay.py), a drafter takes about a
        # second on 128 prompts; decoding in dflash took about 870 s, 14 processes side by side.
        "real": {"train_prompts": 640, "eval_prompts": 128, "max_new": 512,
                 "tokens": 256 * 1024,
                 "eval_max_new": 128,
                 # SpecForge's batch of one conversation takes up to 512 anchors of it: every
                 # labelled position, about 0.77 anchors a target token, a step per ~283 tokens.
                 # Ours at its --target default (src/engine/train/recipe.rs): the same, a step a
                 # conversation on its own anchors, out of rows of 3,072 whose target forward
                 # runs a row at a time.
                 "ours": {"seq_len": 3072, "anchors": 512, "budget": "per-doc",
                          "steps_per_batch": "doc", "lr": 6e-4},
                 # One change at a time from the primary setting (not the whole grid: a GPU
                 # call's minutes), every row shown; the step rows budget anchors per row.
                 # docs/quality.md has the 2026-12-06 sweeps (262K tokens) these come from.
                 "sweep": {
                     "cross": True,
                     "ours": {"step": [{"steps_per_batch": n, "budget": "per-row"}
                                       for n in (1, 6, 12)]
                              + [{"seq_len": 1024, "steps_per_batch": 2, "budget": "per-row"},
                                 {"seq_len": 512, "anchors": 384, "steps_per_batch": 2,
                                  "budget": "per-row"},
                                 {"seq_len": 512, "anchors": 384, "steps_per_batch": 4,
                                  "budget": "per-row"}],
                              "lr": [1e-3, 3e-3]},
                     "sf": {"step": [{"batch": 2}, {"batch": 4}], "lr": [1e-3, 3e-3]},
                 }},
    },
}
# The keys of SIZES[size]["real"] that replace the size's own with --target-dir.
REAL_OVERRIDES = ("tokens", "eval_max_new", "ours", "sf", "sweep")
