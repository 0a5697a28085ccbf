"""No optimizer step made mostly of padding: the trainer spreads verl's padding rows over the
mini-batches of an update (``trainer/batching.py:spread_padding``)."""

import pytest

from pettingllms_verl.trainer.batching import spread_padding


def steps(order, is_padding, ranks, mini_batches):
    """Real rows of each optimizer step (every rank's j-th piece), as verl cuts the ordered batch."""
    chunk = len(order) // ranks
    piece = chunk // mini_batches
    return [
        sum(not is_padding[order[r * chunk + j * piece + i]] for r in range(ranks) for i in range(piece))
        for j in range(mini_batches)
    ]


@pytest.mark.parametrize(
    "real, multiple, ranks",
    [(1025, 256, 1), (1025, 256, 4), (9, 8, 1), (9, 8, 2), (3, 2, 1), (17, 4, 2), (257, 16, 8)],
)
def test_a_step_one_row_past_a_multiple_has_no_mini_batch_under_half_real(real, multiple, ranks):
    size = -(-real // multiple) * multiple  # verl pads at the end, to a multiple of the mini-batch
    is_padding = [i >= real for i in range(size)]
    mini_batches = size // multiple
    plain = steps(list(range(size)), is_padding, ranks, mini_batches)
    order, frac = spread_padding(is_padding, ranks, mini_batches)
    assert sorted(order) == list(range(size))
    spread = steps(order, is_padding, ranks, mini_batches)
    assert sum(spread) == real and min(spread) / multiple == frac
    assert frac >= 0.5, spread
    if mini_batches > 1 and ranks == 1:  # what the end-padding did: a step of a lone real row (or none)
        assert min(plain) <= 1


def test_real_rows_keep_their_order_and_their_rank():
    is_padding = [False, False, True, False, False, False, True, True]  # two ranks of four rows
    order, frac = spread_padding(is_padding, ranks=2, mini_batches=2)
    assert order[:4] == [0, 2, 1, 3] and order[4:] == [4, 6, 5, 7]
    assert sorted(order[:4]) == [0, 1, 2, 3] and sorted(order[4:]) == [4, 5, 6, 7]
    assert frac == 0.5


def test_a_batch_that_does_not_split_is_refused():
    with pytest.raises(ValueError, match="do not split"):
        spread_padding([False] * 6, ranks=4, mini_batches=1)
