"""The caching allocator's figures in the samples (issue 28): `torch.cuda.memory_stats` turned
into a sample's `alloc` entries, read only once the pipeline has initialised CUDA (there is no
GPU here: `is_initialized` and `memory_stats` are stood in for), never failing the pipeline."""

import itertools
import re
import sys

import pytest

from conftest import in_thread
from test_protocol_constants import rust_message_fields

from dflash_top import Profiler, cuda, protocol, wire
from dflash_top.auto import Auto

# What torch.cuda.memory_stats(1) returns, in part (it has many more keys).
STATS = {
    "active.all.current": 7,
    "allocated_bytes.all.current": 3 << 30,
    "allocated_bytes.all.peak": 4 << 30,
    "allocated_bytes.large_pool.current": 2 << 30,
    "num_alloc_retries": 2,
    "num_device_alloc": 130,
    "num_device_free": 110,
    "num_ooms": 0,
    "reserved_bytes.all.current": 13 << 30,
    "reserved_bytes.all.peak": 14 << 30,
    "segment.all.current": 42,
    "segment.all.allocated": 50,
}
ENTRY = {
    "cuda": 1,
    "reserved": 13 << 30,
    "allocated": 3 << 30,
    "segments": 42,
    "allocs": 130,
    "frees": 110,
    "retries": 2,
}


def test_memory_stats_become_an_alloc_entry():
    e = cuda.alloc_entry(1, STATS)
    assert e == ENTRY
    assert tuple(e) == protocol.ALLOC_FIELDS
    # CUDA not initialised: torch gives an empty dict; a key missing: no entry, not zeros.
    assert cuda.alloc_entry(0, {}) is None
    partial = dict(STATS)
    del partial["num_device_free"]
    assert cuda.alloc_entry(1, partial) is None
    # Within the protocol's bounds, whatever torch says.
    odd = dict(STATS, num_device_alloc=-1, num_alloc_retries=1 << 70)
    e = cuda.alloc_entry(1, odd)
    assert (e["allocs"], e["retries"]) == (0, protocol.MAX_COUNT)


def test_the_entry_is_the_rust_sides_and_reads_torchs_keys():
    rust = rust_message_fields()["alloc"]
    required = tuple(n for n, (_, optional) in rust.items() if not optional)
    assert required == protocol.ALLOC_FIELDS
    left_out = tuple(n for n, (_, optional) in rust.items() if optional)
    assert left_out == protocol.ALLOC_OPTIONAL
    assert tuple(protocol.MEMORY_STATS_KEYS) == protocol.ALLOC_FIELDS[1:]
    torch = pytest.importorskip("torch")
    # The keys torch documents for memory_stats, its `{a,b}` alternatives expanded.
    documented = set()
    for pattern in re.findall(r'``"([^"]+)"``', torch.cuda.memory_stats.__doc__ or ""):
        parts = re.split(r"\{([^}]*)\}", pattern)
        choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
        documented |= {"".join(c) for c in itertools.product(*choices)}
    missing = set(protocol.MEMORY_STATS_KEYS.values()) - documented
    assert not missing, "not keys of torch %s's memory_stats: %s" % (torch.__version__, missing)


def test_device_names_give_indices():
    assert [cuda.cuda_index(d) for d in ("cuda:0", "cuda:3", "cuda", "cpu", "cuda:x", "mps")] == [
        0, 3, 0, None, None, None,
    ]


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch's CUDA as a pipeline would leave it: `state["init"]` says whether it initialised
    CUDA; `calls` are the devices memory_stats was asked for; `state["fail"]` makes it raise."""
    torch = pytest.importorskip("torch")
    state = {"init": False, "fail": False}
    calls = []

    def memory_stats(device):
        calls.append(device)
        if state["fail"]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return dict(STATS)

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state["init"])
    monkeypatch.setattr(torch.cuda, "memory_stats", memory_stats)
    return state, calls


def test_a_profilers_samples_carry_the_figures_once_cuda_is_initialised(fake_cuda):
    state, calls = fake_cuda
    p = Profiler(["loader", ("train", ["step"])], serve=False)
    in_thread(lambda: p.thread("loader"), name="loader-0")
    in_thread(lambda: p.thread("train", device="cuda:1"), name="train-0")
    # Not initialised: nothing read, no field.
    assert "alloc" not in p._sample() and calls == []
    state["init"] = True
    s = p._sample()
    assert s["alloc"] == [ENTRY] and calls == [1]
    wire.frame(s)  # it encodes
    # A failing read leaves the figures out and the pipeline alone.
    state["fail"] = True
    assert "alloc" not in p._sample()


def test_only_the_declared_cuda_devices_are_read(fake_cuda):
    state, calls = fake_cuda
    state["init"] = True
    p = Profiler([("train", ["step"])], serve=False)
    in_thread(lambda: p.thread("train"), name="train-0")
    assert "alloc" not in p._sample() and calls == []


def test_zero_code_samples_carry_the_figures_of_the_threads_devices(fake_cuda, monkeypatch):
    state, calls = fake_cuda
    import torch

    state["init"] = True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    a = Auto(serve=False)
    a._torch = torch
    try:
        in_thread(a._rec, name="train-0")
        assert a._sample()["alloc"] == [ENTRY] and calls == [1]
        state["init"] = False
        assert "alloc" not in a._sample()
    finally:
        a.close()


def test_without_torch_imported_nothing_is_read_and_torch_stays_unimported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert cuda.read_alloc([0, 1]) == []
    assert "torch" not in sys.modules
