"""torch_offload.compile(): torch.compile with offloading inside the compiled graphs.

The offloading itself is a partition-time pass (partitioner.py). This module turns on the
checkpointing the mode needs, builds inductor's options (the user's, the ones of an inductor
compile mode, and our partitioner), and refuses what cannot work: CUDA graphs capture
(mode="reduce-overhead" / triton.cudagraphs) would record our ops' host-side bookkeeping once and
replay only the kernels, so the copies would not match the pool's state.
"""
import dataclasses
import functools
from typing import Optional

import torch

from ..hooks.nothing_offloaded import warn_nothing_offloaded
from ..policies import named_policies as policies
from ..policies.projections import projection_groups
from .model_changes import CompileChanges, checkpointed
from ..config.offload_config import OffloadConfig
from ..config.mode_options import MODE_OPTIONS, canonical_mode
from .partitioner import COMPILE_MODES, COMPILED_OPTIONS, OffloadPartitioner, check_min_bytes
from .projection_policy import projection_policy
from .._library.manager import OffloadManager


def compile(model: torch.nn.Module, mode: str = "hidden_states", *, manager=None,
            min_bytes: Optional[int] = None, blocks=None, backend: str = "inductor",
            compile_mode: Optional[str] = None, policy="attention",
            options: Optional[dict] = None, sdpa_is_causal: bool = False, detach_logits: bool = False,
            **compile_kwargs):
    """torch.compile(model) with offloading inside the compiled graphs.

    `mode`: a mode's name, or the OffloadConfig (or mode options) apply() takes: HiddenStatesOptions,
    SelectiveOptions (its policy and min_bytes) or ActivationsOptions (mode "all": its min_bytes);
    the compiled graphs use no other option, and no part besides the activation mode.
    mode="hidden_states": the model's blocks run under torch's gradient checkpointing (a Hugging Face
    model's own, or torch.utils.checkpoint around `blocks`), and the checkpoint inputs are offloaded,
    whatever their size (as eager "hidden_states": min_bytes is refused).
    mode="selective": the same checkpointing with a selective policy (`policy`: a name from
    torch_offload.policies, e.g. "attention", a name with projection groups such as
    "attention+qkv+out_proj" (projection_policy.py: projections recognised by their weights' shapes),
    or a torch policy function `(ctx, op, *args, **kwargs) -> CheckpointPolicy`): outputs it marks
    CheckpointPolicy.MUST_CPU_OFFLOAD of at least min_bytes (default 64 KiB, as eager "selective")
    are saved and offloaded, not recomputed; MUST_SAVE ones stay on the device; the checkpoint
    inputs move whatever their size.
    mode="all": no checkpointing; every saved activation of at least min_bytes (default 1 MiB) is
    offloaded.
    backend="inductor" (default) passes our partitioner through inductor's custom_partitioner_fn
    option; backend="aot_eager" runs the same partitioned graphs with eager kernels (numerically
    identical to eager, for checking). compile_mode is torch.compile's `mode`
    ("default", "max-autotune", "max-autotune-no-cudagraphs"; "reduce-overhead" is refused: CUDA
    graphs). Returns the compiled module; `.offload_partitioner` records what each graph offloads
    (nothing when inductor loads the graphs from its cache: they still call our ops) and holds the
    manager (`.offload_partitioner.manager.stats()`). `options` are inductor's; ours turn its
    buffer reuse off (allow_buffer_reuse=False, see _inductor_options) unless they say otherwise.
    sdpa_is_causal=True (a Hugging Face model with SDPA attention): calls without an attention_mask and
    without a cache use SDPA's is_causal instead of the dense [S, S] mask transformers builds while
    compiling (torch_offload.sdpa_is_causal, hf_causal_mask.py).
    detach_logits=True (a Hugging Face causal LM): calls with labels return the logits detached, so
    backward holds no zero gradient of the logits' size (torch_offload.detach_logits, hf_logits.py;
    no gradient flows through the returned logits).
    Other keyword arguments (fullgraph=True, dynamic=...) go to torch.compile.
    `.offload_changes.remove()` undoes what compile() changed on `model` (its checkpointing,
    config.use_cache, sdpa_is_causal, detach_logits; model_changes.py). A training step whose
    compiled graphs offload nothing warns once, saying why (NothingOffloadedWarning).
    """
    mode, policy, min_bytes = _from_config(mode, policy, min_bytes)
    mode = check_mode(mode, min_bytes)  # before anything changes
    policy_fn, saves_per_block = _policy(model, mode, policy, blocks)
    options = _inductor_options(compile_mode, options, backend)
    # Compiled graphs launch far ahead of the GPU: with saves a layer apart (hidden_states), earlier
    # sources are released in stream order at each save, or the allocator would still count them
    # at the forward's peak. In "all" mode saves are a few kernels apart and that wait would stall.
    # Selective saves several values per block (input, attention output, logsumexp, the products
    # of projection groups): restoring one must prefetch the previous block's, or backward waits
    # on each copy.
    if manager is None:
        manager = OffloadManager(release_sources_on_save=mode != "all", prefetch_depth=saves_per_block)
    partitioner = OffloadPartitioner(manager, mode, min_bytes, call="torch_offload.compile")
    changes = CompileChanges(model)
    try:
        if sdpa_is_causal:
            changes.sdpa_is_causal()
        if detach_logits:
            changes.detach_logits()
        if mode != "all":
            _enable_checkpointing(changes, blocks, policy_fn)
        compiled = _torch_compile(model, partitioner, backend, options, compile_kwargs)
    except BaseException:
        changes.remove()  # a failed compile() leaves the model as it was
        raise
    compiled.offload_partitioner = partitioner
    compiled.offload_changes = changes
    check = _WarnIfNothingOffloaded(partitioner)
    check.hook = compiled.register_forward_hook(check)
    return compiled


def _from_config(mode, policy, min_bytes):
    """(mode name, policy, min_bytes) from what compile() got: a config's activation options, or
    the mode's name with policy= and min_bytes= as given."""
    options = mode.activations if isinstance(mode, OffloadConfig) else mode
    if isinstance(mode, OffloadConfig):
        parts = mode.parts_on()
        if parts:
            raise TypeError(f"torch_offload.compile: the config turns on {', '.join(parts)}, which compiled graphs do "
                            "not take; apply() takes them in eager mode")
    if type(options) not in COMPILED_OPTIONS.values():
        if isinstance(mode, OffloadConfig) or type(options) in MODE_OPTIONS:
            raise TypeError(f"torch_offload.compile: {type(options).__name__ if options is not None else None} is not "
                            f"one of the modes compiled graphs offload ({', '.join(COMPILE_MODES)})")
        return mode, policy, min_bytes  # a mode's name
    default = type(options)()
    unused = [f.name for f in dataclasses.fields(options) if f.name not in ("policy", "min_bytes")
              and getattr(options, f.name) != getattr(default, f.name)]
    if unused:
        raise TypeError(f"torch_offload.compile: {type(options).__name__} sets {', '.join(unused)}, which compiled "
                        "graphs do not use (compile() builds its own manager: pass manager= for another)")
    if options.mode_name == "hidden_states":
        return options.mode_name, policy, None
    return options.mode_name, getattr(options, "policy", None) or policy, options.min_bytes


def check_mode(mode, min_bytes) -> str:
    check_min_bytes(mode, min_bytes, "torch_offload.compile")
    return canonical_mode(mode)


def _torch_compile(model, partitioner: OffloadPartitioner, backend: str, options: dict, compile_kwargs: dict):
    if backend == "inductor":
        options["custom_partitioner_fn"] = partitioner
        return torch.compile(model, options=options, **compile_kwargs)
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def run_eagerly(gm, _example_inputs):
        return make_boxed_func(gm.forward)

    eager_backend = aot_autograd(fw_compiler=run_eagerly, bw_compiler=run_eagerly, partition_fn=partitioner)
    return torch.compile(model, backend=eager_backend, **compile_kwargs)


class _WarnIfNothingOffloaded:
    """Forward hook of the compiled module: after the first call whose graphs were partitioned (a
    training forward: every graph of the call is partitioned by then, graph breaks included), a
    NothingOffloadedWarning if none offloads anything; then the hook goes. Graphs loaded from
    inductor's cache are not partitioned here, so they are not judged."""

    def __init__(self, partitioner: OffloadPartitioner):
        self.partitioner = partitioner
        self.hook = None

    def __call__(self, module, args, output):
        if not self.partitioner.graphs:
            return
        self.hook.remove()
        why = self.partitioner.nothing_offloaded()
        if why is not None:
            warn_nothing_offloaded(why)


def _policy(model, mode: str, policy, blocks):
    """(the selective policy function or None, the saves per block that backward prefetches)."""
    if mode != "selective":
        return None, 1
    if projection_groups(policy):  # a name with projection groups (None for anything else)
        from ..blocks import find_blocks

        return projection_policy(policy, list(blocks) if blocks is not None else find_blocks(model),
                                 "torch_offload.compile")
    return policies.resolve(policy, "torch_offload.compile"), policies.SAVES_PER_BLOCK


def _inductor_options(compile_mode, options, backend) -> dict:
    if backend not in ("inductor", "aot_eager"):
        raise ValueError(f"torch_offload.compile: backend must be 'inductor' or 'aot_eager', got {backend!r}")
    merged = {}
    if compile_mode is not None:
        from torch._inductor import list_mode_options

        if backend != "inductor":
            raise ValueError("torch_offload.compile: compile_mode is for backend='inductor'")
        merged.update(list_mode_options(compile_mode))  # raises on an unknown mode
    # Inductor keeps a dead buffer allocated until a later allocation of the same size can reuse
    # it, judging by its estimate of the graph's peak, which leaves out extern ops' outputs (our
    # restores, attention's gradients). In our backward graphs the restores' outputs are not its
    # buffers, so freed activation-sized buffers waited across layers (0.7 GB at the 16k peak of
    # compiled selective on the reference model). Without reuse each buffer is freed at its last use
    # and the caching allocator recycles it.
    merged["allow_buffer_reuse"] = False
    merged.update(options or {})
    if merged.get("triton.cudagraphs"):
        raise ValueError(
            f"torch_offload.compile: compile_mode={compile_mode!r} / options['triton.cudagraphs'] use CUDA "
            "graphs, which replay kernels without our ops' host-side work (pinned pool, events); use "
            "compile_mode='max-autotune-no-cudagraphs' or the default")
    return merged


def _enable_checkpointing(changes: CompileChanges, blocks, policy_fn) -> None:
    kwargs = {"use_reentrant": False}
    if policy_fn is not None:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, policy_fn)
    model = changes.model
    if blocks is None and hasattr(model, "gradient_checkpointing_enable"):
        changes.hf_checkpointing(kwargs)
        return
    if blocks is None:
        from ..blocks import find_blocks

        blocks = find_blocks(model)
    for block in blocks:
        changes.replace_forward(block, checkpointed(type(block).forward.__get__(block), kwargs))
