"""The model and the variants of benchmarks/bench_hidden_states.py: the random-init
LlamaForCausalLM, one forward+backward step, and `Variant`, which turns one of none / ckpt /
save_on_cpu / hf_offload / ours on and off on the shared model; plus the memory helpers the runs
use between variants (free_memory, torch_pinned_peak)."""
import gc
from contextlib import nullcontext

import torch
import torch_offload


def build_model(args, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=args.layers,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab,
        max_position_embeddings=max(args.seq_list),
        attention_dropout=0.0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(args.seed)
    with torch.device(device):  # initialise on the device: no slow CPU init of 1.26B parameters
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    model.config.use_cache = False
    model.train()
    return model


def train_step(model, ids, context):
    with context():
        out = model(input_ids=ids, labels=ids)
    loss = out.loss
    del out
    loss.backward()
    return loss.detach()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(model, device):
    model.zero_grad(set_to_none=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        # pinned blocks cached by torch's host allocator (save_on_cpu, hf_offload); ours has its own
        empty_host = getattr(torch._C, "_host_emptyCache", None)
        if empty_host is not None:
            empty_host()


def torch_pinned_peak():
    """Peaks of torch's caching host (pinned) allocator since the last reset, when it reports them:
    bytes: pinned blocks it owned (rounded up to powers of two); active: bytes handed out."""
    try:
        stats = torch.cuda.host_memory_stats()
    except Exception:  # noqa: BLE001
        return None
    if "allocated_bytes.peak" not in stats:
        return None
    return {"bytes": stats["allocated_bytes.peak"], "active": stats.get("active_bytes.peak"),
            "num_host_alloc": stats.get("num_host_alloc")}


class Variant:
    """Turns one variant on (enter) and off (exit) on the shared model."""

    def __init__(self, name, model, device, manager_options):
        self.name = name
        self.model = model
        self.device = device
        self.manager_options = manager_options
        self.handle = None
        self.context = nullcontext

    def __enter__(self):
        m = self.model
        if self.name in ("ckpt", "save_on_cpu"):
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.name == "save_on_cpu":
            pin = self.device.type == "cuda"
            self.context = lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin)
        if self.name == "hf_offload":
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False},
                                            offload=True)
        if self.name == "ours":
            self.handle = torch_offload.apply(m, mode="hidden_states", **self.manager_options)
        return self

    def __exit__(self, *exc):
        m = self.model
        if self.handle is not None:
            try:
                self.handle.manager.synchronize()
            except Exception:  # noqa: BLE001  (after an OOM the manager may be mid-step)
                pass
            self.handle.remove()
        if m.is_gradient_checkpointing:
            m.gradient_checkpointing_disable()
        # gradient_checkpointing_enable registers a hook that makes the embedding output require
        # grad and leaves it in place on disable; remove it so every variant sees the same model.
        if getattr(m, "_require_grads_hook", None) is not None:
            m.disable_input_require_grads()
        return False

    def stats(self):
        return self.handle.stats() if self.handle is not None else None

