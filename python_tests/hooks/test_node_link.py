"""The ranks agree on one figure (hooks/node_link.py): what the link budgets and mode "auto" decide
from is the same on every rank."""
from python_tests.support.gloo_ranks import run_ranks
from torch_offload.hooks.node_link import agree, ranks
from torch_offload.modes.auto.controller import AutoController


def _agreed_on_each_rank(rank, world_size):
    own = [1.0 + rank, 10.0 - rank]
    # A trial's timed steps: (seconds, peak GB, bytes to host, early peak GB or None, bytes kept).
    timed = [(0.5 + rank, 3.0 - rank, 100.0, None, 0.0), (0.4, 2.0, 100.0 + rank, None, 0.0)]
    return {"ranks": ranks(), "min": agree(own, "min"), "max": agree(own, "max"),
            "timed": [list(step) for step in AutoController._agreed(timed)]}


def test_every_rank_gets_the_smallest_or_largest_figure():
    result = run_ranks(_agreed_on_each_rank, 2)
    assert result["ranks"] == 2
    assert result["min"] == [1.0, 9.0] and result["max"] == [2.0, 10.0]
    assert result["timed"] == [[1.5, 3.0, 100.0, None, 0.0], [0.4, 2.0, 101.0, None, 0.0]]


def test_one_process_agrees_with_itself():
    assert ranks() == 1 and agree([3, 4.5], "min") == [3.0, 4.5]
