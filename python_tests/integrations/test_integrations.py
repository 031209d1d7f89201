"""torch_offload.integrations with a real transformers Trainer: every mode trains a tiny random
Llama to the same per-step losses and final weights as the same Trainer run without offloading
(fp32, CPU, no dropout), the callback checks its mode and options when it is made, and the config
values axolotl and TRL users write map to our modes. The Hugging Face gradient checkpointing route:
test_hf_gradient_checkpointing.py."""
import copy
import warnings

import pytest
import torch
from accelerate import Accelerator
from transformers import Trainer, TrainingArguments

import torch_offload
from torch_offload.integrations import OffloadCallback, apply_prepared, enable, from_config
from python_tests.support.llama import _freeze_layer_weights, _steps_match_plain, _tiny_llama
from python_tests.support.trainer_runs import TokenDataset, make_trainer

STEPS = 3


def _train(model, tmp_path, callbacks=(), **extra_args):
    trainer = make_trainer(model, tmp_path, STEPS, callbacks, **extra_args)
    trainer.train()
    return trainer


def _model(frozen=False):
    model = _tiny_llama("cpu", dropout=0.0)
    return _freeze_layer_weights(model) if frozen else model


_plain_runs = {}


def _plain(tmp_path, frozen):
    """The same Trainer run without offloading: per-step losses and final weights."""
    if frozen not in _plain_runs:
        model = _model(frozen)
        losses = _train(model, tmp_path).losses
        _plain_runs[frozen] = (losses, {k: v.clone() for k, v in model.state_dict().items()})
    return _plain_runs[frozen]


MODES = [
    ("hidden_states", {}, False),
    ("all", {"min_bytes": 0}, False),
    ("sync", {"min_bytes": 0}, False),
    ("disk", {"min_bytes": 0}, False),
    ("modules", {"targets": ["*.self_attn", "*.mlp"], "min_bytes": 0}, False),
    ("hidden_states", {"layer_offloading": True}, True),
    (None, {"layer_offloading": True}, True),
    ("hidden_states", {"long_context": True}, True),
]


@pytest.mark.parametrize("mode, options, frozen", MODES,
                         ids=["hidden_states", "all", "sync", "disk", "modules",
                              "hidden_states+layers", "layers", "long_context"])
def test_trainer_losses_equal_plain_run(tmp_path, mode, options, frozen):
    if mode == "disk":
        options = dict(options, disk_dir=str(tmp_path / "spill"))
    plain_losses, plain_weights = _plain(tmp_path, frozen)
    model = _model(frozen)
    callback = OffloadCallback(mode, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_offload.NothingOffloadedWarning)
        trainer = _train(model, tmp_path, [callback])
    assert len(trainer.losses) == STEPS
    for step, (ours, plain) in enumerate(zip(trainer.losses, plain_losses)):
        assert torch.equal(ours, plain), f"step {step}: {ours.item()} != {plain.item()}"
    for name, value in model.state_dict().items():
        assert torch.equal(value, plain_weights[name]), name
    # Offloading happened, and was undone when training ended.
    stats = callback.stats if mode is not None else {}
    assert mode is None or stats["saves"] > 0
    assert callback.handle is None
    assert all("forward" not in layer.__dict__ for layer in model.model.layers)


def test_trainer_gradient_checkpointing_is_replaced_then_restored(tmp_path):
    plain_losses, _ = _plain(tmp_path, False)
    model = _model()
    callback = OffloadCallback("hidden_states")
    with pytest.warns(UserWarning, match="use_cache=False"):  # the Trainer sets args.use_cache
        trainer = _train(model, tmp_path, [callback], gradient_checkpointing=True, use_cache=True)
    assert all(torch.equal(a, b) for a, b in zip(trainer.losses, plain_losses))
    assert callback.stats["saves"] > 0
    # remove() at the end of training: HF checkpointing and the cache as the Trainer left them.
    assert model.is_gradient_checkpointing and model.config.use_cache is True


def test_enable_on_a_built_trainer(tmp_path):
    model = _model()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=1,
                             per_device_train_batch_size=2, report_to=[], save_strategy="no",
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=TokenDataset())
    callback = enable(trainer, "all", min_bytes=0)
    assert callback in trainer.callback_handler.callbacks
    trainer.train()
    assert callback.stats["saves"] > 0


@pytest.mark.parametrize("value, expected", [
    (True, "all"), ("true", "all"), ("True", "all"), ("legacy", "sync"), ("disk", "disk"),
    ("hidden_states", "hidden_states"), (False, None), (None, None),
])
def test_config_values_map_to_modes(value, expected):
    assert from_config(value, layer_offloading=True) == {"mode": expected, "layer_offloading": True}
    # chunked_loss: an apply() keyword every mode takes (mode=None takes no mode option).
    callback = OffloadCallback.from_config(value, layer_offloading=True, chunked_loss=True)
    assert (callback.mode, callback.options) == (expected, {"layer_offloading": True, "chunked_loss": True})


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"from_config: unknown activation_offloading='offload_all'"):
        from_config("offload_all")
    with pytest.raises(ValueError, match="nothing to turn on"):
        from_config(False)
    with pytest.raises(ValueError, match="layer_offloading must be true or false"):
        from_config("disk", layer_offloading="yes")


@pytest.mark.parametrize("make, error, match", [
    (lambda: OffloadCallback("hiden_states"), ValueError, r"OffloadCallback\(mode='hiden_states'\): unknown mode"),
    (lambda: OffloadCallback("all", min_byte=0), TypeError,
     r"OffloadCallback\(mode='all'\) got an unexpected keyword argument 'min_byte' \(did you mean min_bytes=\?\)"),
    (lambda: OffloadCallback("hidden_states", min_bytes=0), TypeError, r"'min_bytes' \(mode='hidden_states' offloads"),
    (lambda: OffloadCallback("all", min_bytes=-1), ValueError, r"OffloadCallback\(mode='all'\): min_bytes=-1"),
    (lambda: OffloadCallback("modules"), ValueError,
     r"OffloadCallback\(mode='modules'\): mode='modules' needs targets"),
    (lambda: OffloadCallback("selective", policy="attention+fc9"), ValueError,
     r"OffloadCallback\(mode='selective'\): .*policy='attention\+fc9'"),
    (lambda: OffloadCallback("hidden_states", manager=torch_offload.OffloadManager(), max_in_flight=2), ValueError,
     r"pass either manager= or the options that build one \(max_in_flight\)"),
    (lambda: OffloadCallback.from_config(False, layer_offloading=True, max_in_flight=2), TypeError,
     r"OffloadCallback\(mode=None\) got an unexpected keyword argument 'max_in_flight'"),
    (lambda: OffloadCallback("all", hf_checkpointing=True), ValueError,
     r"hf_checkpointing=True\): mode='all' offloads saved activations and recomputes nothing"),
    (lambda: OffloadCallback("hidden_states", hf_checkpointing=True, every_n_layers=2), TypeError,
     r"'every_n_layers' \(with hf_checkpointing=True it comes from TrainingArguments"),
    (lambda: OffloadCallback("hidden_states", hf_checkpointing=True, layer_offloading=True), TypeError,
     r"'layer_offloading' \(layer offloading comes with torch_offload.apply"),
    (lambda: OffloadCallback("hidden_states", hf_checkpointing="yes"), TypeError, r"hf_checkpointing='yes'"),
], ids=["unknown_mode", "misspelt_option", "option_of_another_mode", "bad_value", "modules_without_targets",
        "bad_policy", "manager_and_options", "option_without_a_mode", "hf_route_mode", "hf_route_every_n_layers",
        "hf_route_layer_offloading", "hf_route_flag"])
def test_callback_checks_mode_and_options_when_made(make, error, match):
    # Before any Trainer or model exists: a wrong mode or option is reported where it was written.
    with pytest.raises(error, match=match):
        make()


def test_apply_route_says_the_trainers_checkpointing_keywords_are_not_used(tmp_path):
    model = _model()
    callback = OffloadCallback("hidden_states")
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=1, per_device_train_batch_size=2,
                             report_to=[], save_strategy="no", disable_tqdm=True, gradient_checkpointing=True,
                             gradient_checkpointing_kwargs={"use_reentrant": True})
    trainer = Trainer(model=model, args=args, train_dataset=TokenDataset(), callbacks=[callback])
    with pytest.warns(UserWarning, match=r"is not used; OffloadCallback\('hidden_states', hf_checkpointing=True\)"):
        trainer.train()
    assert callback.stats["saves"] > 0


def test_accelerate_prepared_model_matches_plain():
    plain = _model()
    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(copy.deepcopy(plain))
    # A wrapper as accelerate builds for several processes: apply_prepared finds the model inside.
    wrapped = torch.nn.parallel.DataParallel(prepared) if prepared is not None else prepared
    handle = apply_prepared(wrapped, "hidden_states")
    assert handle.model is prepared
    _steps_match_plain(prepared, plain, "cpu")
    assert handle.stats()["saves"] > 0


def _offline_tokenizer():
    """A word-level tokenizer over the tiny Llama's 256 ids, built in memory (no Hub access)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, **{f"t{i}": i for i in range(1, 256)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<eos>")


def _sft_train(tmp_path, callbacks=()):
    """TRL's SFTTrainer with its defaults (gradient checkpointing on) except fp32, on CPU."""
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")

    class _LossRecordingSFTTrainer(trl.SFTTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            self.losses.append(loss.detach().clone())
            return loss

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 256, (6, 24), generator=generator).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids})
    args = trl.SFTConfig(output_dir=str(tmp_path / "sft"), use_cpu=True, bf16=False, fp16=False,
                         max_steps=STEPS, per_device_train_batch_size=2, learning_rate=1e-2, seed=0,
                         report_to=[], save_strategy="no", logging_strategy="no",
                         disable_tqdm=True, dataloader_num_workers=0, dataset_num_proc=None)
    model = _model()
    trainer = _LossRecordingSFTTrainer(model=model, args=args, train_dataset=data,
                                       processing_class=_offline_tokenizer(),
                                       callbacks=list(callbacks))
    trainer.losses = []
    trainer.train()
    return trainer


_plain_sft_losses = []


@pytest.mark.parametrize("make_callback", [
    lambda: OffloadCallback("hidden_states"),
    lambda: OffloadCallback("all", min_bytes=0),
    lambda: OffloadCallback.from_config("true", min_bytes=0),  # axolotl's activation_offloading: true
    # SFTConfig turns the model's own gradient checkpointing on by default: ours runs it.
    lambda: OffloadCallback("hidden_states", hf_checkpointing=True),
], ids=["hidden_states", "all", "axolotl_true", "hf_checkpointing"])
def test_trl_sft_trainer_losses_equal_plain_run(tmp_path, make_callback):
    pytest.importorskip("trl")
    if not _plain_sft_losses:
        _plain_sft_losses.extend(_sft_train(tmp_path).losses)
    callback = make_callback()
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_offload.NothingOffloadedWarning)
        trainer = _sft_train(tmp_path, [callback])
    assert len(trainer.losses) == len(_plain_sft_losses) == STEPS
    for step, (ours, plain) in enumerate(zip(trainer.losses, _plain_sft_losses)):
        assert torch.equal(ours, plain), f"step {step}: {ours.item()} != {plain.item()}"
    assert callback.stats["saves"] > 0
    assert callback.handle is None
