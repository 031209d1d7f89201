"""apply(model, mode=...): turns offloading on for a model's blocks (decoder layers).

apply() checks what is common to every mode, turns on layer offloading when asked, and hands the
rest to the mode's entry point (MODES; one module per mode under torch_offload/modes/).
"""
from typing import Iterable, Optional

from torch import nn

from .handle import OffloadHandle, blocks_to_wrap
from .layers import offload_layers
from .lm_loss import chunk_lm_loss_option
from .modes.activations_all import apply_all, apply_disk, apply_sync
from .modes.auto import apply_auto
from .modes.hidden_states import apply_hidden_states
from .modes.modules import apply_modules
from .modes.selective import apply_selective
from .modes.options import check_options

# mode name -> apply_<mode>(model, blocks, manager, options) -> OffloadHandle
MODES = {
    "hidden_states": apply_hidden_states,
    "selective": apply_selective,
    "modules": apply_modules,
    "all": apply_all,
    "sync": apply_sync,
    "disk": apply_disk,
    "auto": apply_auto,
}
# The names axolotl and TRL configs use.
ALIASES = {True: "all", "true": "all", "legacy": "sync"}


def _no_activation_offloading(model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    check_options(None, options, None, (), {name: "mode=None offloads no activations; offload_layers "
                                                   "takes its own options" for name in options})
    if manager is not None:
        raise ValueError("torch_offload.apply: manager is for activation offloading (mode=None has "
                         "none; offload_layers takes its own)")
    return OffloadHandle(model, None, None)


def apply(
    model: nn.Module,
    mode="hidden_states",
    blocks: Optional[Iterable[nn.Module]] = None,
    manager=None,
    *,
    layer_offloading: bool = False,
    chunked_loss=False,
    **options,
) -> OffloadHandle:
    """Turns on offloading for `model` and returns an OffloadHandle (stats(), remove()).

    mode="hidden_states": each block runs under torch_offload.checkpoint while the model is training
    and grad is enabled: its input (the hidden states) moves to pinned host memory during forward
    and comes back, prefetched, when backward recomputes the block. Every block input is offloaded
    whatever its size (no min_bytes).

    mode="all" (alias "true", or True) / "sync" (alias "legacy") / "disk": the activations that
    autograd saves inside every block but the last are offloaded (see offload_activations);
    parameters, buffers, the last block and everything after it (the LM head) stay on the GPU, and
    so do saved tensors under `min_bytes` (default 1 MiB: on a small model that can be all of them;
    a training step that offloads nothing warns once, NothingOffloadedWarning). "disk" writes to
    `disk_dir` (default: a torch_offload directory under the system's temp dir).

    mode="selective": like "hidden_states", and inside each block the op outputs a policy names
    (policy="attention": the fused attention outputs and logsumexp; "attention+qkv+out_proj" and
    other projection groups: also those Linear products; or torch_offload.policies / a torch
    policy function) are offloaded too and not recomputed in backward; outputs under min_bytes
    (default 64 KiB) stay on the device. A group prefixed "keep_" ("attention+qkv+keep_fc1") keeps
    its products on the device instead (neither copied nor recomputed).

    mode="modules": only the activations saved inside the submodules `targets` (name patterns
    such as "*.self_attn" or module classes) and `presets` (named module groups such as "qkv",
    "core_attn": see torch_offload.module_presets) select are offloaded; handle.report() gives the
    bytes expected and freed (see offload_modules). Takes min_bytes like "all".

    mode="auto": the first training steps try hidden_states, the selective policies "attention" and
    "attention+qkv+out_proj", and torch's checkpointing (trial_steps=3 each) and keep the fastest whose peak
    allocated memory fits memory_budget_gb (default: checkpointing's measured peak); where the budget
    leaves room, further trials keep saves on the GPU, leave the last blocks unchecked, or have them
    keep their MLP's up/gate products (modes/auto.py); handle.plan / handle.explain().

    mode=None: no activation offloading (with layer_offloading=True: layer offloading only).

    layer_offloading=True: the frozen weights of every block also live in host memory and are
    brought to the GPU only while the block runs (see offload_layers); handle.layers.stats().

    chunked_loss=True (or a number of tokens per chunk, default 2048): a Hugging Face causal LM
    trained with labels computes its loss over chunks of tokens without materialising the logits,
    and returns logits=None (see chunk_lm_loss); handle.chunked_loss. A dict passes chunk_lm_loss's
    keywords: {"grads_in_forward": True} also computes the loss's gradients in the forward (no
    second pass over the logits in backward; one backward per forward).

    `blocks` defaults to the decoder layers of a Hugging Face model (Llama, Qwen, Mistral and
    similar, PEFT-wrapped too); pass any list of modules for other models. `manager` defaults to
    a new OffloadManager built from the options max_in_flight, prefetch_depth, host_budget_bytes
    (and disk_dir). Options by mode:
      hidden_states:          max_in_flight, prefetch_depth, host_budget_bytes, disk_dir, use_reentrant
      selective:              policy (or block_policies: one per block), min_bytes, and the options
                              of "hidden_states"
      all / sync / disk:      min_bytes, max_in_flight, prefetch_depth, host_budget_bytes, disk_dir
      modules:                targets, presets, and the options of "all"
      auto:                   memory_budget_gb, trial_steps, candidates, max_in_flight, host_budget_bytes,
                              use_reentrant
    use_reentrant=True: our reentrant checkpoint (reentrant.py: cheaper on the host; gradients
    through .backward() only).
    An option the mode does not take raises TypeError naming it.

    On a Hugging Face model apply() turns the model's own gradient checkpointing off and, in
    hidden_states mode, sets config.use_cache=False (with a warning); remove() restores both.
    """
    name = ALIASES.get(mode, mode) if isinstance(mode, (str, bool)) else mode
    if name is not None and name not in MODES:
        names = tuple(MODES) + tuple(k for k in ALIASES if isinstance(k, str))
        raise ValueError(f"torch_offload.apply: unknown mode {mode!r}; expected one of {names} or None")
    entry = MODES[name] if name is not None else _no_activation_offloading
    for default_none in ("targets", "presets"):
        if default_none in options and options[default_none] is None:
            del options[default_none]  # the default, written out
    blocks = list(blocks) if blocks is not None else None
    layers = loss = None
    if chunked_loss is not False and chunked_loss is not None:  # the LM head and loss, not the blocks
        loss = chunk_lm_loss_option(model, chunked_loss)
    try:
        # Layer offloading goes innermost: its weights must be on the device inside the checkpoint's
        # recompute and inside activation hooks.
        if layer_offloading:
            blocks = blocks_to_wrap(model, blocks)
            layers = offload_layers(model, blocks)
        handle = entry(model, blocks, manager, options)
    except Exception:
        for undo in (layers, loss):
            if undo is not None:
                undo.remove()
        raise
    handle.layers, handle.chunked_loss = layers, loss
    return handle
