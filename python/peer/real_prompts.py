"""Prompts of real English text for a real target (python/peer/quality.py --target-dir): the
first paragraph of each documented public function and class of the Python standard library
that runs the harness (Debian ships it as libpython3.X-stdlib; PyPI's CPython builds carry the
same files; licence PSF-2.0), put to the target as a user turn with one of a few requests.

Split by module: a module's paragraphs are all training or all held-out (about one module in
five held out), so no held-out prompt is a training one. The order is fixed for one Python
version (sorted modules and names; the split from a hash of the module's name).
"""

import hashlib
import importlib
import inspect
import sys
import warnings

REQUESTS = [
    "Explain this to someone new to programming:\n\n{text}",
    "Summarize this in two sentences:\n\n{text}",
    "Rewrite this more simply:\n\n{text}",
    "What would you use `{name}` for? Its documentation says:\n\n{text}",
    "Write a short example that uses `{name}`, given this description:\n\n{text}",
]


def held_out(module, share):
    h = int(hashlib.sha256(module.encode()).hexdigest()[:8], 16)
    return h % 1000 < share * 1000


def paragraphs(min_words=8, max_words=160):
    """[(module, dotted name, paragraph)] of the standard library's documented public objects
    (a paragraph seen once only)."""
    out = []
    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test"}
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in skip)
    seen = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mod_name in names:
            try:
                mod = importlib.import_module(mod_name)
            except Exception:  # platform-specific modules
                continue
            for name, obj in members(mod, mod_name):
                doc = inspect.getdoc(obj) or ""
                para = " ".join(doc.split("\n\n")[0].split())
                if not min_words <= len(para.split()) <= max_words or para in seen:
                    continue
                seen.add(para)
                out.append((mod_name, name, para))
    return out


def members(mod, mod_name):
    """(dotted name, object) of a module's public functions and classes, and the classes'
    public methods defined in the module."""
    for name in sorted(dir(mod)):
        obj = getattr(mod, name, None)
        if name.startswith("_") or not callable(obj):
            continue
        if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
            continue
        yield f"{mod_name}.{name}", obj
        if inspect.isclass(obj) and getattr(obj, "__module__", None) == mod_name:
            for m in sorted(vars(obj)):
                if not m.startswith("_") and callable(vars(obj)[m]):
                    yield f"{mod_name}.{name}.{m}", vars(obj)[m]


def prompts(n_train, n_eval, share=0.2, seed=0):
    """(training messages, held-out messages): single-turn chats, module-disjoint."""
    train, held = [], []
    for i, (module, name, text) in enumerate(paragraphs()):
        request = REQUESTS[(i + seed) % len(REQUESTS)].format(name=name, text=text)
        msgs = [{"role": "user", "content": request}]
        (held if held_out(module, share) else train).append(msgs)
    if len(train) < n_train or len(held) < n_eval:
        raise SystemExit(
            f"the standard library gives {len(train)} training and {len(held)} held-out prompts "
            f"here, fewer than the {n_train} and {n_eval} asked for: ask for fewer"
        )
    # Spread over the modules rather than the first ones in the alphabet.
    pick = lambda xs, n: [xs[j * len(xs) // n] for j in range(n)]  # noqa: E731
    return pick(train, n_train), pick(held, n_eval)


if __name__ == "__main__":
    t, h = prompts(8, 4)
    print(len(paragraphs()), "paragraphs; e.g.", t[0][0]["content"][:200], "|", h[0][0]["content"][:200])
