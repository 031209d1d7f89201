"""benchmarks/peak_memory.py's boundary_bound on hand-written allocation traces: the step peak with
the saved block inputs taken out, which says how much offloading the boundaries can free at most."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import GB  # noqa: E402
from benchmarks.peak_memory import boundary_bound  # noqa: E402

B = 64  # one block input's bytes in these traces


def _alloc(addr, size):
    return {"action": "alloc", "addr": addr, "size": size}


def _free(addr):
    return {"action": "free_completed", "addr": addr}


def _bound(trace, backward_event, layers=2):
    return boundary_bound({"device_traces": [trace]}, 0, {"backward_event": backward_event}, B, layers)


def test_bound_is_the_peak_without_the_saved_block_inputs():
    # forward: two block inputs saved (1, 2), a temporary of boundary size freed in forward (3);
    # backward: a gradient buffer (4) at the peak, then the boundaries freed.
    trace = [_alloc(1, B), _alloc(3, B), _free(3), _alloc(2, B), _alloc(4, 100), _free(2), _alloc(5, 30),
             _free(1), _free(4), _free(5)]
    bound = _bound(trace, backward_event=4)
    assert bound["boundaries"] == 2
    # live at each event less live boundaries: the peak is 100 + 30 at event 6
    assert bound["bound_peak_GB"] == pytest.approx(130 / GB)
    assert bound["bound_event"] == 6


def test_a_reused_address_is_not_a_boundary_and_later_ones_of_that_size_are_not_counted():
    # boundary 1 is freed in backward and its address reused by a gradient of the same size (7);
    # a third forward allocation of boundary size live into backward (the final norm's input) is
    # past `layers` boundaries, so it stays in the bound.
    trace = [_alloc(1, B), _alloc(2, B), _alloc(9, B), _free(9), _alloc(6, B), _free(1), _alloc(1, B),
             _free(2), _free(6), _free(1)]
    bound = _bound(trace, backward_event=5)
    assert bound["boundaries"] == 2
    assert bound["bound_peak_GB"] == pytest.approx(2 * B / GB)  # the final-norm input and the reused address
