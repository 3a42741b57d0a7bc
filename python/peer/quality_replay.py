"""Acceptance by replay: what z-lab dflash 0.1.0's greedy `dflash_generate` would measure, from
one target forward and one drafter forward a prompt instead of one of each a decoding round.

Greedy speculative decoding is lossless: whatever the drafter proposes, the output is the
target's greedy continuation S. At a round that starts at position a (S[a] the token the target
last produced), the drafter sees the target's captured states of S[:a] and the block
[S[a], mask, ...] at positions a, a+1, ...; the round accepts the drafts that match S[a+1:] in a
row, produces that many plus one, and the next round starts there. None of that depends on the
rounds before except through a, so one target forward over S gives every context, one drafter
forward over a block at every position (each block seeing the context before it and itself, as
in training) gives every round's drafts, and a walk from the first reply position reads off the
rounds dflash would take: the same blocks (the last ones shortened at the end, as dflash's are),
the same stop at the target's stop tokens, the same acceptance lengths.

What differs is arithmetic only: the target's states come from one forward, not from a prefill
and 16-token verifications against a cache, so a near tie of the target's logits can fall the
other way (the walk counts the positions where the one-forward argmax disagrees with S). On the
CPU in f32, python/peer/quality.py --replay-check measures drafters both ways and the table
carries the differences (tests/quality.rs asserts them).
"""

import torch


def greedy_replies(target, eval_rows, device, max_new, stop_ids, batch):
    """The target's own greedy reply to each prompt, up to len(row's reply[:max_new]) tokens,
    ending at its first stop token (kept) if one comes: the S after the prompt."""
    from transformers import GenerationConfig

    out = []
    for i in range(0, len(eval_rows), batch):
        rows = eval_rows[i : i + batch]
        n = max(len(r["reply"][:max_new]) for r in rows)
        width = max(len(r["prompt"]) for r in rows)
        # Left padding: every prompt ends at the same column, as generate() wants.
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for j, r in enumerate(rows):
            ids[j, width - len(r["prompt"]) :] = torch.tensor(r["prompt"])
            mask[j, width - len(r["prompt"]) :] = 1
        # Plain greedy, whatever the model's own generation_config asks (a penalty, other stop
        # tokens): dflash_generate takes the argmax and stops at the target's eos ids.
        greedy = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=stop_ids,
                                  pad_token_id=stop_ids[0])  # fmt: skip
        with torch.inference_mode():
            got = target.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                generation_config=greedy,
            )
        for j, r in enumerate(rows):
            reply = got[j, width:].tolist()[: len(r["reply"][:max_new])]
            stop = next((k for k, t in enumerate(reply) if t in stop_ids), None)
            out.append(reply if stop is None else reply[: stop + 1])
    return out


class Replay:
    """One target's greedy replies to the held-out prompts and their captured states, made once;
    `acceptance(drafter)` replays dflash's rounds for each prompt."""

    def __init__(self, target, eval_rows, device, max_new, batch=16):
        eos = target.config.eos_token_id
        self.stop_ids = eos if isinstance(eos, list) else [eos]
        self.target = target
        self.device = device
        self.rows = eval_rows
        self.max_new = max_new
        # With batch 1 no padding enters the arithmetic (the CPU check wants it so).
        self.replies = greedy_replies(target, eval_rows, device, max_new, self.stop_ids, batch)
        self.states = {}  # layer ids -> [(S, captured states of S, argmax disagreements)]

    def _captured(self, layer_ids):
        key = tuple(layer_ids)
        if key not in self.states:
            got = []
            for row, reply in zip(self.rows, self.replies):
                s = row["prompt"] + reply
                ids = torch.tensor([s], device=self.device)
                with torch.inference_mode():
                    out = self.target(ids, output_hidden_states=True)
                feats = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
                argmax = out.logits[0].argmax(-1).tolist()
                p = len(row["prompt"])
                off = sum(argmax[k] != s[k + 1] for k in range(p - 1, len(s) - 1))
                got.append((s, feats, off))
            self.states[key] = got
        return self.states[key]

    def disagreements(self, layer_ids):
        """Reply positions where the one-forward argmax is not S's next token, over all prompts."""
        return sum(off for _, _, off in self._captured(layer_ids))

    def acceptance(self, drafter):
        """(acceptance length per prompt, outputs equal to the row's reply) of `drafter`, a
        dflash DFlashDraftModel on the target's device and dtype."""
        for layer in drafter.layers:
            if layer.self_attn.is_causal or layer.self_attn.sliding_window is not None:
                raise SystemExit("replay takes drafters of full attention (dflash's default); "
                                 "this one has causal or sliding layers: --measure decode")  # fmt: skip
        per, same = [], 0
        for row, reply, (s, feats, _) in zip(self.rows, self.replies,
                                             self._captured(drafter.target_layer_ids)):  # fmt: skip
            p = len(row["prompt"])
            max_length = p + len(row["reply"][: self.max_new])
            proposed = drafts(drafter, self.target, s, feats, p, max_length) if len(s) > p + 1 else {}
            rounds = walk(s, p, max_length, proposed, self.stop_ids)
            if not rounds:  # dflash_generate would divide by zero here too
                raise SystemExit(f"held-out prompt {len(per)}: the target's reply ends at once "
                                 "(no decoding round); drop it from the held-out set")  # fmt: skip
            per.append(sum(rounds) / len(rounds))
            same += reply == row["reply"][: self.max_new]
        return per, same


def drafts(drafter, target, s, feats, first, max_length):
    """{a: the drafter's tokens for positions a+1.. of the block at a}, for each round start a
    from `first` to the last one s allows, blocks of min(block, max_length - a) tokens as
    dflash_generate makes them (max_length: the prompt and the most new tokens asked for)."""
    from dflash.model import _draft_value, _output_head, _raw_input_embeddings

    device = feats.device
    block = drafter.block_size
    starts = list(range(first, min(len(s), max_length) - 1))
    sizes = [min(block, max_length - a) for a in starts]
    ctx = starts[-1]  # the last round's block sees the positions before its start
    # One pass over the blocks: their tokens and positions, the rows of each (`spans`), and the
    # rows whose outputs are drafts (all but each block's first).
    ids, pos, spans, keep = [], [], [], []
    for a, n in zip(starts, sizes):
        spans.append((a, len(ids), n))
        keep += range(len(ids) + 1, len(ids) + n)
        ids += [s[a]] + [drafter.mask_token_id] * (n - 1)
        pos += range(a, a + n)
    q = len(ids)
    # Queries of the block at a see the context before a and their own block, nothing else.
    visible = torch.zeros((q, ctx + q), dtype=torch.bool, device=device)
    for a, at, n in spans:
        visible[at : at + n, :a] = True
        visible[at : at + n, ctx + at : ctx + at + n] = True
    noise = _raw_input_embeddings(
        target,
        torch.tensor([ids], device=device),
        float(_draft_value(drafter.config, "input_embedding_scale", 1.0)),
    )
    position_ids = torch.tensor([list(range(ctx)) + pos], device=device)
    with torch.inference_mode():
        hidden = drafter(
            target_hidden=feats[:, :ctx],
            noise_embedding=noise,
            position_ids=position_ids,
            attention_mask=visible[None, None],
        )[0]
        keep = torch.tensor(keep, device=device)
        tokens = drafter.compute_logits(hidden[keep], _output_head(target)).argmax(-1).tolist()
    out, at = {}, 0
    for a, n in zip(starts, sizes):
        out[a] = tokens[at : at + n - 1]
        at += n - 1
    return out


def walk(s, first, max_length, proposed, stop_ids):
    """The tokens each round of dflash_generate produces (its acceptance_lengths): from the round
    at `first`, accept the drafts that match s in a row, produce them and the target's next
    token, stop at max_length or after a stop token. Positions past the end of s (a reply that
    stopped early) match nothing."""
    rounds = []
    start = first
    stopped = s[start] in stop_ids if start < len(s) else True
    while start + 1 < max_length and not stopped:
        accepted = 0
        for k, t in enumerate(proposed.get(start, [])):
            if start + 1 + k < len(s) and s[start + 1 + k] == t:
                accepted += 1
            else:
                break
        produced = min(accepted + 1, max_length - start - 1)
        for k in range(1, produced + 1):
            if start + k >= len(s) or s[start + k] in stop_ids:
                produced, stopped = k, True
                break
        start += produced
        rounds.append(produced)
    return rounds
