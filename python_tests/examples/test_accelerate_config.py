"""examples/accelerate/fsdp2.yaml as `accelerate launch --config_file` reads it: accelerate's launcher
turns the file into the environment of the processes it starts, from which the Trainer's Accelerator
builds its FullyShardedDataParallelPlugin. Built here the same way, without launching: FSDP2, the
decoder layers as FSDP units (the blocks torch_offload wraps), FSDP's activation checkpointing off.

Not launched: accelerate turns FSDP on only on accelerators (MULTI_GPU and its kin); on CPU a launched
Trainer runs DDP on gloo (use_cpu=True) or one process per rank with no FSDP at all, so a CPU launch
would not run FSDP2."""
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "accelerate" / "fsdp2.yaml"


@pytest.fixture
def plugin(monkeypatch):
    """The FullyShardedDataParallelPlugin a process launched with the config builds."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(CONFIG), "--main_process_port", "0", "train.py"])
    args, _, _ = _validate_launch_command(args)
    assert args.use_fsdp
    for name, value in prepare_multi_gpu_env(args).items():
        if name.startswith(("ACCELERATE_", "FSDP_")):
            monkeypatch.setenv(name, value)
    return FullyShardedDataParallelPlugin()


def test_the_config_is_fsdp2_without_activation_checkpointing(plugin):
    from torch.distributed.fsdp import StateDictType

    assert plugin.fsdp_version == 2
    assert plugin.activation_checkpointing is False and plugin.activation_checkpointing_offload is False
    assert plugin.reshard_after_forward is True
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert plugin.cpu_ram_efficient_loading is True


def test_the_fsdp_units_are_the_blocks_torch_offload_wraps(plugin):
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    import torch_offload
    from python_tests.support.llama import _tiny_llama

    model = _tiny_llama("cpu")
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    assert [m for m in model.modules() if policy(m)] == torch_offload.find_blocks(model) == list(model.model.layers)
