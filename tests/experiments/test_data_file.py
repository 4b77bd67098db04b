"""The split rule of a command's own data (``held_out_split``): the given ``held_out``, else the
last N // d samples when there is something to score, else none; and its refusals."""

import numpy as np
import pytest

from rpm.experiments.data_file import held_out_split


@pytest.mark.parametrize("num, share, held", [
    (300, 3, 100),  # rpm lds's generated data: 200 training and 100 test sequences
    (250, 5, 50),  # rpm pendulum's: 200 and 50
    (10, 3, 3),
    (7, 5, 1),
    (2, 5, 1),  # N // d = 0: still one held out
    (3, 2, 1),
    (4, 2, 2),
])
def test_the_default_split_holds_out_the_last_samples(num, share, held):
    mask = held_out_split(None, num, "sequences", share=share, scored_by="states")
    expected = np.array([False] * (num - held) + [True] * held)
    assert mask.dtype == np.bool_ and np.array_equal(mask, expected)


def test_without_anything_to_score_every_sample_trains():
    mask = held_out_split(None, 9, "pairs", share=5, scored_by=None)
    assert mask.dtype == np.bool_ and mask.shape == (9,) and not mask.any()
    assert not held_out_split(None, 1, "pairs", share=5, scored_by=None).any()


def test_a_share_below_two_is_refused():
    with pytest.raises(ValueError, match="share must be an integer >= 2"):
        held_out_split(None, 10, "pairs", share=1, scored_by="latents")


def test_a_given_split_is_kept():
    given = np.array([True, False, False, True, False])
    for scored_by in ("latents", None):
        mask = held_out_split(given, 5, "pairs", share=5, scored_by=scored_by)
        assert np.array_equal(mask, given)


@pytest.mark.parametrize("held_out, num, scored_by, message", [
    (None, 1, "states", "too few sequences (1) to score: the states need at least 2 sequences"),
    (np.ones(4, dtype=bool), 4, None, "held_out marks all 4 sequences: none is left to train on"),
    (np.ones(4, dtype=bool), 4, "states", "held_out marks all 4 sequences"),
    (np.zeros(4, dtype=bool), 4, "states", "held_out marks no sequence, but the scores need at "
     "least one held-out sequence (or leave out the states)"),
    (np.zeros(4, dtype=int), 4, None, "held_out must be a boolean array"),
    (np.zeros(3, dtype=bool), 4, None, "held_out must have shape (4,), one entry per sequence"),
])
def test_bad_splits_are_refused_in_one_line(held_out, num, scored_by, message):
    with pytest.raises(ValueError) as info:
        held_out_split(held_out, num, "sequences", share=3, scored_by=scored_by)
    assert message in str(info.value) and "\n" not in str(info.value)
