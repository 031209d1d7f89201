"""torch_offload.integrations.OffloadLightningCallback with a real Lightning Trainer on CPU: a tiny
random Llama inside a LightningModule trains to the same per-step losses and final weights as the
same fit without offloading (fp32, no dropout), something was offloaded, the model is as it was
after the fit (or a failed one), and a wrong option raises when the callback is made. Under FSDP2
(ModelParallelStrategy, one gloo rank) the callback applies after configure_model's fully_shard."""
import os

import pytest
import torch
import torch.distributed as dist

pl = pytest.importorskip("lightning.pytorch")

from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: E402

from torch_offload.integrations import OffloadLightningCallback  # noqa: E402
from python_tests.support.llama import _tiny_llama  # noqa: E402

STEPS = 2


class CausalLM(pl.LightningModule):
    """A Hugging Face causal LM as `self.model`, each step's loss kept exactly."""

    def __init__(self, fail_at_step=None):
        super().__init__()
        self.model = _tiny_llama("cpu", dropout=0.0)
        self.losses, self.fail_at_step = [], fail_at_step

    def training_step(self, batch, batch_index):
        if batch_index == self.fail_at_step:
            raise RuntimeError("failed step")
        loss = self.model(input_ids=batch, labels=batch).loss
        self.losses.append(loss.detach().clone())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-2)


class ShardedCausalLM(CausalLM):
    """FSDP2 as Lightning runs it: fully_shard on each decoder layer and the model in configure_model."""

    def configure_model(self):
        mesh = self.device_mesh["data_parallel"]
        for layer in self.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)


class HandleSeen(pl.Callback):
    """What the offloading callback held during the first training step."""

    def __init__(self, offloading):
        self.offloading, self.model = offloading, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_index):
        if self.model is None:
            self.model = self.offloading.handle.model


def _fit(module, *callbacks, **trainer_args):
    ids = torch.randint(0, 256, (2 * STEPS, 24), generator=torch.Generator().manual_seed(1))
    trainer = pl.Trainer(accelerator="cpu", max_steps=STEPS, callbacks=list(callbacks), logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         **trainer_args)
    trainer.fit(module, torch.utils.data.DataLoader(ids, batch_size=2))
    return trainer


_plain = []


def _plain_run():
    """The same fit without offloading: per-step losses and final weights."""
    if not _plain:
        module = CausalLM()
        _fit(module)
        _plain.extend([module.losses, {k: v.clone() for k, v in module.state_dict().items()}])
    return _plain


def _restored(model):
    """No forward of ours left on the Hugging Face model or its layers."""
    return all("forward" not in m.__dict__ and "_torch_offload_handle" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("mode, options, applied_to", [
    ("hidden_states", {}, "model"),
    ("all", {"min_bytes": 0}, "model"),
    ("hidden_states", {"chunked_loss": True}, "model"),  # needs the Hugging Face model: found in the module
    ("hidden_states", {"module": ""}, ""),  # the LightningModule itself: apply() finds the layers inside
], ids=["hidden_states", "all", "chunked_loss", "lightning_module"])
def test_fit_equals_the_plain_fit_and_is_undone(mode, options, applied_to):
    plain_losses, plain_weights = _plain_run()
    module = CausalLM()
    callback = OffloadLightningCallback(mode, **options)
    seen = HandleSeen(callback)
    _fit(module, callback, seen)
    assert seen.model is module.get_submodule(applied_to)
    assert len(module.losses) == STEPS
    for step, (ours, plain) in enumerate(zip(module.losses, plain_losses)):
        assert torch.equal(ours, plain), f"step {step}: {ours.item()} != {plain.item()}"
    for name, value in module.state_dict().items():
        assert torch.equal(value, plain_weights[name]), name
    assert callback.stats["saves"] > 0 and callback.stats["bytes_to_host"] > 0
    assert callback.handle is None and _restored(module)


@pytest.fixture
def one_gloo_rank():
    """Lightning's ModelParallelStrategy on one CPU device: a gloo process group, which Lightning
    leaves initialised (with its MASTER_* variables) after the fit; both undone after the test."""
    if dist.is_initialized():
        pytest.skip("a process group is initialised already")
    environment = dict(os.environ)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(environment)


def test_fsdp2_fit_applies_after_fully_shard(one_gloo_rank):
    from lightning.pytorch.strategies import ModelParallelStrategy

    plain = ShardedCausalLM()
    _fit(plain, strategy=ModelParallelStrategy())
    module = ShardedCausalLM()
    callback = OffloadLightningCallback("hidden_states")
    seen = HandleSeen(callback)
    _fit(module, callback, seen, strategy=ModelParallelStrategy())
    assert seen.model is module.model and all(isinstance(layer, FSDPModule) for layer in module.model.model.layers)
    assert len(module.losses) == STEPS and all(torch.equal(a, b) for a, b in zip(module.losses, plain.losses))
    assert callback.stats["bytes_to_host"] > 0 and _restored(module)


def test_a_failed_fit_is_undone():
    module = CausalLM(fail_at_step=1)
    callback = OffloadLightningCallback("hidden_states")
    with pytest.raises(RuntimeError, match="failed step"):
        _fit(module, callback)
    assert callback.handle is None and _restored(module)
    assert callback.stats["saves"] > 0  # the first step ran offloaded


def test_a_second_fit_applies_again():
    module = CausalLM()
    callback = OffloadLightningCallback("hidden_states")
    _fit(module, callback)
    first = callback.stats["saves"]
    _fit(module, callback)
    assert callback.stats["saves"] == first > 0 and _restored(module)


@pytest.mark.parametrize("call, error, match", [
    (lambda: OffloadLightningCallback("all", min_byts=0), TypeError, "min_byts"),
    (lambda: OffloadLightningCallback("everything"), ValueError, "everything"),
    (lambda: OffloadLightningCallback("hidden_states", manager=object(), max_in_flight=2), ValueError,
     "either manager= or the options that build one"),
    (lambda: OffloadLightningCallback("hidden_states", module=0), TypeError, "module=0"),
])
def test_wrong_options_raise_when_made(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_module_that_is_not_there_is_named():
    module = CausalLM()
    with pytest.raises(ValueError, match=r"module='backbone': CausalLM has no submodule"):
        _fit(module, OffloadLightningCallback("hidden_states", module="backbone"))
    assert _restored(module)


def test_two_hugging_face_models_ask_for_module():
    module = CausalLM()
    module.teacher = _tiny_llama("cpu", dropout=0.0)
    callback = OffloadLightningCallback("hidden_states")
    with pytest.raises(ValueError, match=r"holds 2 Hugging Face models \(model, teacher\); name the one"):
        callback.target(module)
    assert OffloadLightningCallback("hidden_states", module="teacher").target(module) is module.teacher
