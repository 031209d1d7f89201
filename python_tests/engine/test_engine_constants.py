"""What the engine declares once and the package reads from the library instead of repeating it:
the names of the statistics (csrc/offload_stats.h), which docs/reference/stats.md documents, each
once; the defaults of the manager's options (csrc/manager_config.h); the codes of the save filter's
decisions (csrc/save_decision.h)."""
import inspect
import re
from pathlib import Path

import pytest
import torch

import torch_offload
from torch_offload._library.manager import DECISIONS, MANAGER_DEFAULTS, STAT_NAMES
from torch_offload.hooks import offload_hooks, save_filter
from torch_offload.hooks.saved_regions import SaveCounters
from torch_offload.config.mode_options import ManagerOptions
from torch_offload.policies.store import KeptBytes

STATS_REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "stats.md"


def test_stat_names_are_the_keys_of_stats():
    manager = torch_offload.OffloadManager()
    assert list(manager.stats()) == list(STAT_NAMES)
    assert list(torch.ops.offload.stat_names()) == list(STAT_NAMES)
    assert len(set(STAT_NAMES)) == len(STAT_NAMES)
    assert set(torch_offload.stats(manager)) == set(STAT_NAMES)


def _documented_keys() -> list:
    """The keys in the first column of the reference's tables, up to its "Other reports" (the keys of
    other dicts)."""
    text = STATS_REFERENCE.read_text().split("\n## Other reports")[0]
    keys = []
    for line in text.splitlines():
        if line.startswith("| `"):
            keys += re.findall(r"`(\w+)`", line.split("|")[1])
    return keys


def test_the_stats_reference_documents_each_statistic_once():
    documented = _documented_keys()
    assert len(documented) == len(set(documented)), "a key documented twice"
    reported = set(STAT_NAMES) | {KeptBytes.STAT}  # the engine's, and the one the package adds
    assert set(documented) == reported, (
        f"missing from {STATS_REFERENCE.name}: {sorted(reported - set(documented))}; "
        f"documented but not reported: {sorted(set(documented) - reported)}")


def test_python_counters_add_to_engine_statistics_only():
    counters = SaveCounters(STAT_NAMES)
    counters.add(saved_tensors=1, kept_bytes=64)
    assert counters.snapshot() == {"saved_tensors": 1, "kept_bytes": 64}
    with pytest.raises(KeyError, match=r"'kept_byte' is none of the engine's statistics"):
        counters.add(kept_byte=64)
    counters.reset()
    assert counters.snapshot() == {}


def test_manager_defaults_are_the_engines():
    assert set(MANAGER_DEFAULTS._fields) == {"max_in_flight", "prefetch_depth", "host_budget_bytes",
                                             "keep_on_device_bytes", "disk_io_threads"}
    assert MANAGER_DEFAULTS._asdict() == dict(torch.ops.offload.manager_defaults())
    for manager in (torch.classes.offload.OffloadManager(), torch_offload.OffloadManager()):
        assert manager.max_in_flight() == MANAGER_DEFAULTS.max_in_flight
        assert manager.prefetch_depth() == MANAGER_DEFAULTS.prefetch_depth
        assert manager.host_budget_bytes() == MANAGER_DEFAULTS.host_budget_bytes
        assert manager.keep_on_device_bytes() == MANAGER_DEFAULTS.keep_on_device_bytes
        assert manager.disk_io_threads() == MANAGER_DEFAULTS.disk_io_threads
    # The Python entry points that build a manager default to the engine's bound on copies.
    for entry in (torch_offload.OffloadManager, torch_offload.offload_activations, torch_offload.offload_layers):
        assert inspect.signature(entry).parameters["max_in_flight"].default == MANAGER_DEFAULTS.max_in_flight
    assert ManagerOptions().max_in_flight == MANAGER_DEFAULTS.max_in_flight


def test_decisions_are_the_codes_the_filter_returns():
    assert DECISIONS._asdict() == dict(torch.ops.offload.save_decisions())
    assert (offload_hooks.KEEP, offload_hooks.LEAF_WITHOUT_GRAD) == (DECISIONS.keep, DECISIONS.leaf_without_grad)
    assert len(set(DECISIONS)) == len(DECISIONS)
    manager = torch_offload.OffloadManager()
    kept = save_filter.SaveFilter(manager, min_bytes=0)
    pack = torch.ops.offload.offload_pack_filtered

    def decision(t, not_a_weight=False):
        return pack(t, manager.id(), kept.id, not_a_weight)[1]

    activation = torch.randn(4, 4, requires_grad=True) * 2
    assert decision(activation) == DECISIONS.offload
    assert decision(torch.nn.Parameter(torch.randn(4, 4))) == DECISIONS.keep
    assert decision(torch.randn(0)) == DECISIONS.caller_decides
    assert decision(torch.randn(4, 4)) == DECISIONS.leaf_without_grad
    assert decision(torch.randn(4, 4), not_a_weight=True) == DECISIONS.offload
