"""torch_offload.integrations.gradient_checkpointing_enable: a Hugging Face model's own gradient
checkpointing, in transformers' terms, running torch_offload's checkpoint; and its Trainer route,
OffloadCallback(hf_checkpointing=True). Losses and every parameter gradient must equal transformers'
own checkpointing bit for bit (fp32, CPU; attention dropout on, so the recompute must replay the RNG),
every checkpointed layer's input must have gone through the engine, and remove() must put
transformers' state back."""
import copy
import functools

import pytest
import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer

import torch_offload
from python_tests.support.grads import assert_same_grads
from python_tests.support.llama import _llama_step, _tiny_llama
from python_tests.support.trainer_runs import make_trainer
from torch_offload.integrations import OffloadCallback, gradient_checkpointing_enable
from torch_offload.integrations.hf_checkpointing import CheckpointFunction, take_over

BATCH, SEQ, HIDDEN = 2, 32, 64
LAYER_INPUT_BYTES = BATCH * SEQ * HIDDEN * 4  # fp32 hidden states of one layer
STEPS = 3


def _functions(model):
    """module -> (gradient_checkpointing flag, the function transformers' layers call)."""
    return {name: (module.gradient_checkpointing, module.__dict__.get("_gradient_checkpointing_func"))
            for name, module in model.named_modules() if hasattr(module, "gradient_checkpointing")}


def _steps_match(ours, theirs, steps=STEPS):
    ids = torch.randint(0, 256, (BATCH, SEQ), generator=torch.Generator().manual_seed(3))
    for step in range(steps):
        for model in (ours, theirs):
            model.zero_grad(set_to_none=True)
        loss_ours, loss_theirs = _llama_step(ours, ids, "cpu"), _llama_step(theirs, ids, "cpu")
        assert torch.equal(loss_ours, loss_theirs), f"step {step}: {loss_ours.item()} != {loss_theirs.item()}"
        assert_same_grads(ours, theirs)


@pytest.mark.parametrize("every_n_layers, use_reentrant", [(1, False), (2, False), (1, True)],
                         ids=["every_layer", "every_2nd_layer", "reentrant"])
def test_matches_transformers_gradient_checkpointing(every_n_layers, use_reentrant):
    ours = _tiny_llama("cpu", dropout=0.1)
    theirs = copy.deepcopy(ours)
    kwargs = {"use_reentrant": use_reentrant}
    theirs.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs, every_n_layers=every_n_layers)
    handle = gradient_checkpointing_enable(ours, gradient_checkpointing_kwargs=kwargs, every_n_layers=every_n_layers)
    checkpointed = list(ours.model.layers)[::every_n_layers]  # layers 0, 1, 2 or 0, 2: as transformers picks
    assert handle.blocks == checkpointed and handle.mode == "hidden_states"
    assert [layer.gradient_checkpointing for layer in ours.model.layers] == \
        [layer.gradient_checkpointing for layer in theirs.model.layers]
    assert handle.gradient_checkpointing_kwargs == kwargs
    _steps_match(ours, theirs)
    stats = handle.stats()
    # Each checkpointed layer's input, every step, and nothing else.
    assert stats["saves"] == STEPS * len(checkpointed)
    assert stats["bytes_to_host"] == STEPS * len(checkpointed) * LAYER_INPUT_BYTES
    assert stats["live_handles"] == 0
    handle.remove()


def test_selective_matches_transformers_gradient_checkpointing():
    # "attention+qkv" needs each layer's projections: the layer is passed to selective_checkpoint as block=.
    ours = _tiny_llama("cpu", dropout=0.0)
    theirs = copy.deepcopy(ours)
    theirs.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    handle = gradient_checkpointing_enable(ours, "selective", policy="attention+qkv", min_bytes=0)
    _steps_match(ours, theirs)
    attention = LAYER_INPUT_BYTES + BATCH * 4 * SEQ * 4  # SDPA's output and logsumexp (4 heads)
    qkv = BATCH * SEQ * (64 + 32 + 32) * 4  # q (4 heads of 16), k and v (2 heads)
    assert handle.stats()["bytes_to_host"] == STEPS * 3 * (LAYER_INPUT_BYTES + attention + qkv)
    handle.remove()


def test_transformers_installs_and_calls_the_function_we_replace():
    """What the one private step relies on: transformers' gradient_checkpointing_enable installs one
    functools.partial(torch.utils.checkpoint.checkpoint, **kwargs) as `_gradient_checkpointing_func`
    and its layers call that attribute. If a transformers release changes either, this fails."""
    model = _tiny_llama("cpu", dropout=0.0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    installed = {id(f): f for _, f in _functions(model).values()}
    assert len(installed) == 1, installed
    function = next(iter(installed.values()))
    assert isinstance(function, functools.partial) and function.func is torch_checkpoint
    assert function.keywords == {"use_reentrant": False}
    assert all(isinstance(layer, GradientCheckpointingLayer) for layer in model.model.layers)
    model.gradient_checkpointing_disable()

    handle = gradient_checkpointing_enable(model)
    assert all(isinstance(f, CheckpointFunction) for _, f in _functions(model).values())
    ids = torch.randint(0, 256, (BATCH, SEQ))
    model(input_ids=ids, labels=ids).loss.backward()
    assert handle.stats()["saves"] == len(model.model.layers), "the layers did not call the installed function"
    handle.remove()


def test_remove_turns_checkpointing_off_and_releases_the_manager():
    model = _tiny_llama("cpu", dropout=0.0)
    plain = copy.deepcopy(model)
    model.config.use_cache = True
    with pytest.warns(UserWarning, match=r"gradient_checkpointing_enable: setting config.use_cache=False"):
        handle = gradient_checkpointing_enable(model, max_in_flight=2)
    assert model.config.use_cache is False and model.is_gradient_checkpointing
    assert handle.manager.max_in_flight() == 2
    _steps_match(model, plain, steps=1)
    saved = handle.stats()
    handle.remove()
    # transformers' gradient_checkpointing_disable(): every flag off, its default function back.
    assert not model.is_gradient_checkpointing and model.config.use_cache is True
    assert all(f is torch_checkpoint for _, f in _functions(model).values())
    assert handle.manager is None and handle.stats() == saved  # the statistics it had when removed
    handle.remove()  # twice: nothing left to undo
    _steps_match(model, plain, steps=1)


def test_remove_puts_back_transformers_own_checkpointing():
    model = _tiny_llama("cpu", dropout=0.0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True}, every_n_layers=2)
    before = _functions(model)
    handle = gradient_checkpointing_enable(model, gradient_checkpointing_kwargs={"use_reentrant": False})
    assert handle.blocks == list(model.model.layers)
    handle.remove()
    after = _functions(model)
    assert after.keys() == before.keys()
    assert all(after[name][0] == before[name][0] and after[name][1] is before[name][1] for name in before)


def test_accelerate_prepared_model():
    from accelerate import Accelerator

    theirs = _tiny_llama("cpu", dropout=0.1)
    prepared = Accelerator(cpu=True).prepare(copy.deepcopy(theirs))
    wrapped = torch.nn.parallel.DataParallel(prepared)  # a wrapper as accelerate builds for several processes
    theirs.gradient_checkpointing_enable()
    handle = gradient_checkpointing_enable(wrapped)
    assert handle.model is prepared
    _steps_match(prepared, theirs, steps=2)
    assert handle.stats()["saves"] == 2 * 3
    handle.remove()


def _model_is_untouched(model):
    return not model.is_gradient_checkpointing and not any(
        isinstance(f, CheckpointFunction) for _, f in _functions(model).values())


def _policy_function(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize("arguments, error, match", [
    ({"gradient_checkpointing_kwargs": {"use_reentrant": False, "preserve_rng": True}}, TypeError,
     r"gradient_checkpointing_kwargs has 'preserve_rng', which torch_offload.checkpoint does not take"),
    ({"gradient_checkpointing_kwargs": {"every_n_layers": 2}}, TypeError, r"pass every_n_layers= as an argument"),
    ({"gradient_checkpointing_kwargs": {"offload": True}}, ValueError,
     r"has offload=True: offload=True is transformers'"),
    ({"offload": True}, ValueError, r"offload=True is transformers' own offloading .* leave it off"),
    ({"every_n_layers": 0}, ValueError, r"every_n_layers=0; expected an int >= 1"),
    ({"mode": "all"}, ValueError,
     r"mode='all' offloads saved activations and recomputes nothing.*apply\(model, 'all'\)"),
    ({"mode": "fast"}, ValueError, r"unknown mode 'fast'"),
    ({"max_in_fligt": 2}, TypeError, r"unexpected keyword argument 'max_in_fligt' \(did you mean max_in_flight=\?\)"),
    ({"use_reentrant": True}, TypeError, r"'use_reentrant' \(use_reentrant is a key of gradient_checkpointing_kwargs"),
    ({"max_in_flight": -1}, ValueError, r"max_in_flight=-1; expected an int >= 0"),
    ({"manager": "M", "max_in_flight": 2}, ValueError, r"pass either manager= or the options that build one"),
    ({"mode": "selective", "gradient_checkpointing_kwargs": {"context_fn": lambda: None}}, ValueError,
     r"mode='selective' brings its own"),
    ({"mode": "selective", "policy": "attention+fc9"}, ValueError, r"fc9"),
    ({"mode": "selective", "policy": _policy_function, "gradient_checkpointing_kwargs": {"use_reentrant": True}},
     ValueError, r"use_reentrant=True takes the named policies"),
], ids=["unknown_key", "every_n_layers_key", "offload_key", "offload", "every_n_layers_0", "mode_all",
        "unknown_mode", "misspelt_option", "use_reentrant_option", "bad_value", "manager_and_options",
        "selective_context_fn", "bad_policy", "reentrant_policy_function"])
def test_errors_name_what_was_written(arguments, error, match):
    model = _tiny_llama("cpu", dropout=0.0)
    arguments = dict(arguments)
    if arguments.get("manager") == "M":
        arguments["manager"] = torch_offload.OffloadManager()
    with pytest.raises(error, match=match) as raised:
        gradient_checkpointing_enable(model, **arguments)
    assert "torch_offload.integrations.gradient_checkpointing_enable" in str(raised.value)
    assert _model_is_untouched(model)


def test_refuses_what_would_checkpoint_twice():
    model = _tiny_llama("cpu", dropout=0.0)
    with pytest.raises(TypeError, match=r"Linear has no gradient_checkpointing_enable\(\)"):
        gradient_checkpointing_enable(torch.nn.Linear(2, 2))
    handle = gradient_checkpointing_enable(model)
    with pytest.raises(ValueError, match="runs torch_offload's checkpoint already; call remove"):
        gradient_checkpointing_enable(model)
    handle.remove()
    applied = torch_offload.apply(model, "hidden_states")
    with pytest.raises(ValueError, match=r"apply\(\) already checkpoints this model's layers"):
        gradient_checkpointing_enable(model)
    applied.remove()
    assert _model_is_untouched(model)


def test_keywords_trls_selective_checkpointing_adds_are_kept_or_refused():
    # TRL's SFTConfig(gradient_checkpointing_kwargs={"selective": True}) wraps the model's
    # gradient_checkpointing_enable to add a context_fn (torch's selective checkpointing keeps the
    # attention outputs). Ours runs the keywords transformers installed: mode "hidden_states" runs that
    # context_fn, mode "selective" (which brings its own) refuses it and leaves the model as it was.
    sac = pytest.importorskip("trl.models.selective_activation_checkpointing")
    ours = _tiny_llama("cpu", dropout=0.0)
    theirs = copy.deepcopy(ours)
    for model in (ours, theirs):
        sac.enable_selective_activation_checkpointing(model)
    with pytest.raises(ValueError, match=r"the keywords model.gradient_checkpointing_enable installed has context_fn"):
        gradient_checkpointing_enable(ours, "selective")
    assert _model_is_untouched(ours)
    theirs.gradient_checkpointing_enable()
    handle = gradient_checkpointing_enable(ours)
    assert set(handle.gradient_checkpointing_kwargs) == {"use_reentrant", "context_fn"}
    _steps_match(ours, theirs, steps=2)
    assert handle.stats()["bytes_to_host"] == 2 * 3 * LAYER_INPUT_BYTES
    handle.remove()


def test_take_over_refuses_a_function_it_does_not_know():
    model = _tiny_llama("cpu", dropout=0.0)
    model.gradient_checkpointing_enable(offload=True)  # save_on_cpu around torch's checkpoint
    before = _functions(model)
    with pytest.raises(RuntimeError, match=r"not one functools.partial\(torch.utils.checkpoint.checkpoint"):
        take_over(model, "hidden_states", "the call", "the keywords")
    assert _functions(model) == before


# The Trainer route: TrainingArguments(gradient_checkpointing=True, gradient_checkpointing_kwargs=...).

def _trainer(model, tmp_path, callbacks=(), **extra_args):
    return make_trainer(model, tmp_path, STEPS, callbacks, **extra_args)


@pytest.mark.parametrize("checkpoint_kwargs, checkpointed", [
    (None, 3), ({"use_reentrant": True, "every_n_layers": 2}, 2)], ids=["defaults", "reentrant_every_2nd"])
def test_trainer_route_matches_transformers_checkpointing(tmp_path, checkpoint_kwargs, checkpointed):
    theirs = _tiny_llama("cpu", dropout=0.1)
    ours = copy.deepcopy(theirs)
    arguments = dict(gradient_checkpointing=True, gradient_checkpointing_kwargs=checkpoint_kwargs)
    reference = _trainer(theirs, tmp_path, **arguments)
    reference.train()
    callback = OffloadCallback("hidden_states", hf_checkpointing=True)
    trainer = _trainer(ours, tmp_path, [callback], **arguments)
    trainer.train()
    assert len(trainer.losses) == len(reference.losses) == STEPS
    for step, (a, b) in enumerate(zip(trainer.losses, reference.losses)):
        assert torch.equal(a, b), f"step {step}: {a.item()} != {b.item()}"
    theirs_weights = theirs.state_dict()
    for name, value in ours.state_dict().items():
        assert torch.equal(value, theirs_weights[name]), name
    # Every checkpointed layer's input went through the engine, every step.
    assert callback.stats["saves"] == STEPS * checkpointed
    assert callback.stats["bytes_to_host"] == STEPS * checkpointed * 2 * 24 * HIDDEN * 4
    # Training ended: the Trainer's own checkpointing is back, as on the reference model.
    assert callback.handle is None
    mine, reference_functions = _functions(ours), _functions(theirs)
    assert {k: v[0] for k, v in mine.items()} == {k: v[0] for k, v in reference_functions.items()}
    for flag, function in mine.values():
        assert function.func is torch_checkpoint
        assert function.keywords == next(iter(reference_functions.values()))[1].keywords


def test_trainer_route_errors(tmp_path):
    model = _tiny_llama("cpu", dropout=0.0)
    trainer = _trainer(model, tmp_path, [OffloadCallback("hidden_states", hf_checkpointing=True)])
    with pytest.raises(ValueError, match=r"and it is off: set TrainingArguments\(gradient_checkpointing=True\)"):
        trainer.train()
    model = _tiny_llama("cpu", dropout=0.0)
    trainer = _trainer(model, tmp_path, [OffloadCallback("hidden_states", hf_checkpointing=True)],
                       gradient_checkpointing=True, gradient_checkpointing_kwargs={"offload": True})
    with pytest.raises(ValueError, match=r"has offload=True: offload=True is transformers' own offloading"):
        trainer.train()
    assert not any(isinstance(f, CheckpointFunction) for _, f in _functions(model).values())
