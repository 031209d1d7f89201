"""Host memory shared by the ranks of a node: node_host_budget_bytes split by LOCAL_WORLD_SIZE into
each rank's host budget, a clear error naming it when a rank goes over, and each rank's statistics
gathered on rank 0 (2 gloo CPU ranks)."""
import pytest
import torch

import torch_offload
from python_tests.support.gloo_ranks import run_ranks
from python_tests.support.llama import _tiny_llama

# Every test here runs with the C save hooks and with the Python ones (conftest.save_hooks).
pytestmark = pytest.mark.usefixtures("save_hooks")

MiB = 1 << 20


def test_node_budget_is_split_by_local_world_size(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert torch_offload.OffloadManager(node_host_budget_bytes=8 * MiB).host_budget_bytes() == 2 * MiB
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # not under torchrun: one rank has it all
    assert torch_offload.OffloadManager(node_host_budget_bytes=8 * MiB).host_budget_bytes() == 8 * MiB


def test_node_budget_errors(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="either node_host_budget_bytes .* or host_budget_bytes"):
        torch_offload.OffloadManager(host_budget_bytes=MiB, node_host_budget_bytes=8 * MiB)
    with pytest.raises(ValueError, match="node_host_budget_bytes=3 split over LOCAL_WORLD_SIZE=4"):
        torch_offload.OffloadManager(node_host_budget_bytes=3)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "zero")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='zero'"):
        torch_offload.OffloadManager(node_host_budget_bytes=8 * MiB)


@pytest.mark.parametrize("mode", ["hidden_states", "all"])
def test_rank_over_its_share_gets_an_error_naming_the_node_budget(monkeypatch, mode):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    model = _tiny_llama("cpu", dropout=0.0)
    options = {} if mode == "hidden_states" else {"min_bytes": 0}
    # One layer input is 2*32*64*4 = 16 KiB: a 24 KiB share holds one, not the three layers' inputs.
    torch_offload.apply(model, mode, node_host_budget_bytes=48 * 1024, **options)
    ids = torch.randint(0, 256, (2, 32))
    with pytest.raises(RuntimeError, match=r"over its share of node_host_budget_bytes=49152: "
                                           r"24576 bytes each for LOCAL_WORLD_SIZE=2 ranks"):
        model(input_ids=ids, labels=ids).loss.backward()


def test_offload_layers_over_its_share_names_the_node_budget(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    model = _tiny_llama("cpu", dropout=0.0).requires_grad_(False)
    with pytest.raises(RuntimeError, match="node_host_budget_bytes=65536"):
        torch_offload.offload_layers(model, node_host_budget_bytes=64 * 1024)


def _train_and_gather(rank, world_size):
    model = _tiny_llama("cpu", dropout=0.0)
    handle = torch_offload.apply(model, "hidden_states", node_host_budget_bytes=64 * MiB)
    ids = torch.randint(0, 256, (2, 32))
    for _ in range(rank + 1):  # ranks do different amounts of work: each rank's own stats come back
        model(input_ids=ids, labels=ids).loss.backward()
    gathered = torch_offload.gather_stats(handle)
    assert (gathered is None) == (rank != 0)
    return {"gathered": gathered, "rank0_budget": handle.manager.host_budget_bytes()}


def test_stats_of_every_rank_gathered_on_rank_0():
    result = run_ranks(_train_and_gather, 2, timeout_s=120)
    assert result["rank0_budget"] == 32 * MiB  # LOCAL_WORLD_SIZE=2
    assert [stats["saves"] for stats in result["gathered"]] == [3, 6]
    assert [stats["bytes_to_host"] for stats in result["gathered"]] == [3 * 16384, 6 * 16384]
