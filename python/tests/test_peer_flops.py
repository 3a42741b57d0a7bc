"""python/peer/compare.py's `step_flops`, the MFU numerator for every stack it compares, against
a hand count on tiny shapes: the same shapes and figures as src/engine/model/flops.rs's tests, so
that the two counts stay one."""

import importlib.util
import os

import pytest

from conftest import REPO

pytest.importorskip("dflash")
pytest.importorskip("transformers")


def load_compare():
    spec = importlib.util.spec_from_file_location(
        "compare", os.path.join(REPO, "python", "peer", "compare.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compare = load_compare()

# hidden 8, intermediate 16, 6 target layers (the drafter's 2 read layers 1 and 3: 4 run),
# 2 heads and 1 KV head of 4, vocab 32.
TINY = (8, 16, 6, 2, 1, 4, 32, False)
ROW = dict(seq=32, anchors=2, block=4, drafter_layers=2)


def test_a_row_of_one_document_is_counted_by_hand():
    # Target: a token through a layer 8 x (2 x 8 + 2 x 4) + 3 x 8 x 16 = 576 multiply-adds;
    # 4 layers x (2 x 32 x 576 + 4 x 8 x 32 x 33 / 2) = 4 x (36,864 + 16,896) = 215,040.
    # Drafter, 8 block tokens, a layer: 2 x 8 x 576 = 9,216; context keys and values
    # 2 x 32 x 2 x 8 x 4 = 4,096; attention 4 x 8 x 8 x (15 + 4) = 4,864 (anchors at 0..=30:
    # 15 context keys on average). Two layers 36,352; fc 2 x 32 x 16 x 8 = 8,192.
    # Forward 44,544; backward 2 x 36,352 + 8,192 = 80,896; loss 2 x 2 x 6 x 8 x 32 = 6,144.
    want = 215_040 + 44_544 + 80_896 + 6_144
    assert compare.step_flops(TINY, 1, **ROW) == want
    assert compare.step_flops(TINY, 3, **ROW) == 3 * want


def test_documents_narrow_both_attentions_as_counted_by_hand():
    # Documents of 20 and 12. Target: 210 + 78 = 288 pairs, 4 x (36,864 + 4 x 8 x 288)
    # = 184,320. Drafter: anchors at offsets 0..=18 and 0..=10, context keys
    # (171 + 55) / 30 on average; layers 2 x (9,216 + 4,096 + 4 x 8 x 8 x (226 / 30 + 4))
    # = 32,529.0667; forward 32,529.0667 + 8,192, backward 2 x 32,529.0667 + 8,192; loss 6,144.
    got = compare.step_flops(TINY, 1, docs=[20, 12], **ROW)
    assert got == pytest.approx(184_320 + 40_721.0667 + 73_250.1333 + 6_144, rel=1e-9)
    assert got == pytest.approx(304_435.2, rel=1e-12)
    with pytest.raises(AssertionError):
        compare.step_flops(TINY, 1, docs=[20, 11], **ROW)


def test_synthetic_rows_are_whole_documents_filling_the_row():
    rows = compare.synthetic_docs(3072, rows=8)
    assert len(rows) == 8
    for docs in rows:
        assert sum(docs) == 3072
        assert any(n >= 3072 // 4 for n in docs)
