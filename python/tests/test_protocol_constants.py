"""Every constant of dflash_top.protocol equals the Rust side's: src/wire/protocol.rs (framing,
message kinds, the message structs), and the enums and structs it names from src/telemetry
(timings, commands, training numbers), read from the repository and parsed here."""

import glob
import os
import re

import pytest

from conftest import PYTHON_DIR, REPO

from dflash_top import protocol

PROTOCOL_RS = os.path.join(REPO, "src", "wire", "protocol.rs")

pytestmark = pytest.mark.skipif(
    not os.path.exists(PROTOCOL_RS), reason="not in the repository (no src/wire/protocol.rs)"
)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def strip_comments(src):
    return re.sub(r"//[^\n]*", "", src)


def rust_const(src, name):
    m = re.search(r"pub const %s\s*:\s*([^=]+?)\s*=\s*(.+?);" % name, src)
    assert m, "no `pub const %s` in protocol.rs" % name
    return m.group(1), m.group(2)


def rust_int(expr):
    """An integer constant expression of digits, `_`, `<<`, `*`, `+` and parentheses."""
    e = expr.replace("_", "")
    assert re.fullmatch(r"[0-9\s<>*+()]+", e), "not a simple integer expression: %r" % expr
    return int(eval(e, {"__builtins__": {}}))  # digits and operators only, checked above


def attributes(before):
    """The `#[...]` attributes right before an item, one or several lines each (doc comments are
    already blank)."""
    m = re.search(r"(?:\s*#\[[^\]]*\])*\s*$", before)
    return m.group(0).strip()


def block(src, head):
    """The body of the `{ ... }` after the first match of the regex `head`."""
    m = re.search(head, src)
    assert m, "no %r" % head
    i = src.index("{", m.end() - 1)
    depth = 0
    for j in range(i, len(src)):
        if src[j] == "{":
            depth += 1
        elif src[j] == "}":
            depth -= 1
            if depth == 0:
                return src[i + 1 : j], attributes(src[: m.start()])
    raise AssertionError("unbalanced braces after %r" % head)


_ALL = []


def all_src():
    """Every .rs file under src/, comments stripped, one string (read once)."""
    if not _ALL:
        paths = sorted(glob.glob(os.path.join(REPO, "src", "**", "*.rs"), recursive=True))
        _ALL.append("\n".join(strip_comments(read(p)) for p in paths))
    return _ALL[0]


def find_item(kind, name):
    """The body of `pub enum NAME` / `pub struct NAME` / `impl NAME` wherever it is under src/,
    and the attributes just before it."""
    head = r"impl %s\b" % name if kind == "impl" else r"pub %s %s\b" % (kind, name)
    return block(all_src(), head + r"[^{;]*\{")


def variants(body):
    """Enum variants in order (attributes and payloads skipped)."""
    body = re.sub(r"#\[[^\]]*\]", "", body)
    out = []
    depth = 0
    tok = ""
    for ch in body:
        if ch in "({":
            if depth == 0 and tok.strip():
                out.append(tok.strip())
                tok = ""
            depth += 1
        elif ch in ")}":
            depth -= 1
        elif depth == 0:
            if ch == ",":
                if tok.strip():
                    out.append(tok.strip())
                tok = ""
            else:
                tok += ch
    if tok.strip():
        out.append(tok.strip())
    return out


def snake(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def fields(body):
    """Struct fields: name -> (type, whether serde lets it be left out)."""
    out = {}
    attrs = ""
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("#["):
            attrs += line
            continue
        m = re.match(r"pub (\w+)\s*:\s*(.+?),?$", line)
        if m:
            ty = m.group(2)
            out[m.group(1)] = (ty, "default" in attrs or ty.startswith("Option<"))
            attrs = ""
    return out


def protocol_src():
    """protocol.rs and the files of its module (frame.rs, bounds.rs; not its tests), comments
    stripped, one string."""
    if not os.path.exists(PROTOCOL_RS):
        return ""
    parts = sorted(glob.glob(os.path.join(REPO, "src", "wire", "protocol", "*.rs")))
    paths = [PROTOCOL_RS] + [p for p in parts if os.path.basename(p) != "tests.rs"]
    return "\n".join(strip_comments(read(p)) for p in paths)


SRC = protocol_src()


def test_magic():
    ty, value = rust_const(SRC, "MAGIC")
    m = re.fullmatch(r'\*b"([^"]*)"', value)
    assert m, value
    assert protocol.MAGIC == m.group(1).encode()
    assert ty.replace(" ", "") == "[u8;%d]" % len(protocol.MAGIC)


def test_version():
    ty, value = rust_const(SRC, "VERSION")
    assert ty == "u32"
    assert protocol.VERSION == rust_int(value)


def test_max_frame():
    _, value = rust_const(SRC, "MAX_FRAME")
    assert protocol.MAX_FRAME == rust_int(value)


def test_preamble_and_frame_header_lengths():
    pre, _ = block(SRC, r"pub fn write_preamble_version\b[^{]*\{")
    assert re.search(r"\[0u8;\s*%d\]" % protocol.PREAMBLE_LEN, pre), pre
    assert "b[..8]" in pre and "b[8..]" in pre and "to_le_bytes" in pre
    assert protocol.PREAMBLE_LEN == len(protocol.MAGIC) + 4
    rd, _ = block(SRC, r"pub fn read_msg\b[^{]*\{")
    assert re.search(r"\[0u8;\s*%d\]" % protocol.FRAME_HEADER_LEN, rd), rd
    assert "u32::from_le_bytes" in rd


def test_message_kinds():
    body, attrs = block(SRC, r"pub enum Msg\b[^{]*\{")
    assert 'tag = "t"' in attrs and 'rename_all = "snake_case"' in attrs, attrs
    names = [v for v in variants(body) if v != "Unknown"]  # serde(other): any unknown kind
    assert "#[serde(other)]" in body.replace(" ", "")
    assert tuple(snake(v) for v in names) == protocol.KINDS
    for k in protocol.KINDS:
        assert getattr(protocol, k.upper()) == k


def test_gpu_timings_and_step_timings():
    body, _ = find_item("enum", "GpuTiming")
    assert tuple(variants(body)) == protocol.GPU_TIMINGS
    body, _ = find_item("enum", "Timing")
    assert variants(body) == [protocol.TIMING_HOST] + [
        protocol.TIMING_OF[g] for g in protocol.GPU_TIMINGS
    ]
    # Timing::of, the mapping itself.
    of, _ = block(find_item("impl", "Timing")[0], r"fn of\b[^{]*\{")
    assert dict(re.findall(r"GpuTiming::(\w+)\s*=>\s*Timing::(\w+)", of)) == protocol.TIMING_OF


def test_commands():
    body, attrs = find_item("enum", "HubCommand")
    assert 'tag = "cmd"' in attrs and 'content = "value"' in attrs, attrs
    assert 'rename_all = "snake_case"' in attrs
    assert tuple(snake(v) for v in variants(body)) == protocol.COMMANDS


def test_training_numbers_are_the_fields_of_train_metrics():
    body, attrs = find_item("struct", "TrainMetrics")
    f = fields(body)
    assert tuple(f) == protocol.METRICS
    # All optional on the wire: a field left out is not a decode error.
    assert "#[serde(default)]" in attrs.replace(" ", "") or all(o for _, o in f.values())
    assert re.search(r"\[f32;\s*MAX_SLOTS\]", f["slot_acc"][0])
    m = re.search(r"pub const MAX_SLOTS\s*:\s*\w+\s*=\s*(.+?);", all_src())
    assert m, "no `pub const MAX_SLOTS` under src/"
    assert protocol.MAX_SLOTS == rust_int(m.group(1))


def test_allocator_entries_and_bounds():
    body, _ = block(SRC, r"pub struct WireAlloc\b[^{]*\{")
    f = fields(body)
    assert tuple(n for n in f if n not in protocol.ALLOC_OPTIONAL) == protocol.ALLOC_FIELDS
    assert all(n in f and f[n][1] for n in protocol.ALLOC_OPTIONAL)
    _, value = rust_const(SRC, "MAX_CUDA_DEVICES")
    assert protocol.MAX_CUDA_DEVICES == rust_int(value)
    _, value = rust_const(SRC, "MAX_COUNT")
    assert protocol.MAX_COUNT == rust_int(value)
    body, _ = block(SRC, r"pub struct Sample\b[^{]*\{")
    assert fields(body)["alloc"] == ("Vec<WireAlloc>", True)


def test_package_version_is_tied_to_the_protocol():
    major, minor, _ = protocol.__version__.split(".")
    assert (int(major), int(minor)) == (0, protocol.VERSION)
    import dflash_top

    assert dflash_top.__version__ == protocol.__version__
    assert dflash_top.PROTOCOL_VERSION == protocol.VERSION
    py = read(os.path.join(PYTHON_DIR, "pyproject.toml"))
    assert re.search(r'version\s*=\s*\{\s*attr\s*=\s*"dflash_top\.protocol\.__version__"', py)


def test_docs_name_the_same_version():
    doc = os.path.join(REPO, "docs", "protocol.md")
    if not os.path.exists(doc):
        pytest.skip("no docs/protocol.md")
    assert "(version %d)" % protocol.VERSION in read(doc).splitlines()[0]


# Used by test_profiler.py: what the Rust side's message structs accept.
MESSAGE_STRUCTS = {
    "hello": "Hello",
    "thread": "ThreadDecl",
    "queue": "QueueDecl",
    "step": "WireStep",
    "sample": "Sample",
}


def rust_message_fields():
    """kind -> {field: (type, optional)} for the structs the producer's messages decode into,
    plus the sample's parts (`live`, `q`)."""
    out = {
        k: fields(block(SRC, r"pub struct %s\b[^{]*\{" % s)[0]) for k, s in MESSAGE_STRUCTS.items()
    }
    out["live"] = fields(block(SRC, r"pub struct WireLive\b[^{]*\{")[0])
    out["q"] = fields(block(SRC, r"pub struct WireQueue\b[^{]*\{")[0])
    out["alloc"] = fields(block(SRC, r"pub struct WireAlloc\b[^{]*\{")[0])
    return out
