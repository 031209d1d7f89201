"""benchmarks/peak_memory.py's trace analysis on hand-written allocation traces: boundary_bound, the
step peak with the saved block inputs taken out, which says how much offloading the boundaries can
free at most, and analyse's classes of what is live at a peak."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import GB  # noqa: E402
from benchmarks.peak_memory import analyse, boundary_bound  # noqa: E402

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


def test_the_backward_peak_tells_saved_block_inputs_from_other_forward_memory():
    # forward: a block input (1) and a smaller saved tensor (2), both live into backward; backward:
    # a 100-byte buffer (3) allocated while both are live, the step's peak.
    trace = [_alloc(1, B), _alloc(2, 16), _alloc(3, 100), _free(3), _free(1), _free(2)]
    phases = analyse({"device_traces": [trace]}, 0, {"backward_event": 2}, block_input_bytes=B)
    assert phases["backward"]["traced_GB"] == pytest.approx((B + 16 + 100) / GB)
    categories = {name: c["count"] for name, c in phases["backward"]["categories"].items()}
    assert categories == {"forward, block input size": 1, "allocated in forward": 1, "backward, < 10 MB": 1}


def test_fsdp2_collectives_are_told_apart_from_the_model_and_from_restores():
    # backward: an all-gathered layer (1, FSDP2's alloc_storage), a gradient shard on the
    # reduce-scatter stream (2, foreach_reduce) and a recompute buffer (3), all live at the peak.
    trace = [_alloc(9, 8), dict(_alloc(1, 40), frames=[{"name": "alloc_storage"}]),
             dict(_alloc(2, 20), stream=7, frames=[{"name": "allocate"}, {"name": "foreach_reduce"}]),
             _alloc(3, 30), _free(1), _free(2), _free(3), _free(9)]
    phases = analyse({"device_traces": [trace]}, 0, {"backward_event": 1}, block_input_bytes=B)
    categories = {name: c["GB"] * GB for name, c in phases["backward"]["categories"].items()}
    assert categories == pytest.approx({"allocated in forward": 8,
                                        "backward, FSDP2 all-gather (unsharded parameters)": 40,
                                        "backward, FSDP2 reduce-scatter (gradient shards, their buffers)": 20,
                                        "backward, < 10 MB": 30})


def test_an_allocation_from_before_the_trace_freed_in_the_step_lowers_the_peak():
    # 50 bytes allocated before the trace (the baseline: a layer's weights prefetched by the last
    # step) are freed in forward; the backward's 80-byte buffer then peaks at baseline - 50 + 80.
    trace = [_alloc(1, 20), {"action": "free_completed", "addr": 99, "size": 50}, _alloc(2, 80), _free(2), _free(1)]
    phases = analyse({"device_traces": [trace]}, 50, {"backward_event": 2})
    assert phases["backward"]["peak_GB"] == pytest.approx((50 - 50 + 20 + 80) / GB)
    assert phases["backward"]["baseline_freed_GB"] == pytest.approx(50 / GB)
    assert phases["forward"]["peak_GB"] == pytest.approx((50 + 20) / GB)  # before the free
    bound = boundary_bound({"device_traces": [trace]}, 50, {"backward_event": 2}, 20, 1)
    assert bound["bound_peak_GB"] == pytest.approx(80 / GB)  # the boundary (1) and the freed 50 out
