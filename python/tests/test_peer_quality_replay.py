"""python/peer/quality_replay.py's walk: the rounds greedy dflash_generate takes, read off the
target's greedy sequence and the drafts proposed at each position (tests/quality.rs checks the
whole replay against dflash's decoding on the CPU size)."""

import os
import sys

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "python", "peer"))

from quality_replay import walk

STOP = [99]


def test_rounds_accept_matching_drafts_then_the_targets_token():
    # prompt [10, 11]; the target's greedy reply 1..6; 8 tokens at most.
    s = [10, 11, 1, 2, 3, 4, 5, 6]
    proposed = {2: [2, 3, 9], 5: [5, 6]}
    # At 2: drafts 2, 3 match, 9 does not (s[5] is 4): 2 accepted, 3 produced. At 5: both
    # drafts match but only 2 tokens are left before the end.
    assert walk(s, 2, 8, proposed, STOP) == [3, 2]


def test_a_stop_token_ends_the_rounds_where_it_is_produced():
    s = [10, 1, 2, 99]
    # 2 and 99 match; the round produces up to the stop token and decoding stops.
    assert walk(s, 1, 10, {1: [2, 99, 5]}, STOP) == [2]
    # A stop token reached by the target's own token (no draft matched) ends it too.
    assert walk(s, 1, 10, {}, STOP) == [1, 1]


def test_a_drafter_that_never_matches_gives_one_token_a_round():
    s = [10, 1, 2, 3, 4]
    assert walk(s, 1, 5, {a: [0] * 3 for a in range(5)}, STOP) == [1, 1, 1]


def test_a_reply_that_starts_with_a_stop_token_has_no_round():
    assert walk([10, 99], 1, 8, {}, STOP) == []
