"""The KV caches a recomputing mode turns off: every Hugging Face config in a model whose use_cache is on.

A recomputed layer cannot fill a KV cache: the recompute would append its keys and values a second
time, and the checkpoint's recompute would save more tensors than the forward did. A model's
top-level config is not the only one its forwards read: T5's decoder stack holds a copy of the
config of its own (is_decoder=True), a vision-language model's language model holds the text
sub-config, and each reads `self.config.use_cache`. So every module's config counts, with its
sub-configs (transformers' `sub_configs`).
"""
import warnings
from typing import List, NamedTuple


class KVCache(NamedTuple):
    where: str  # how the config is reached from the model, e.g. "decoder.config"
    config: object


def caches_to_disable(model) -> List[KVCache]:
    """The configs of `model` (its own, its modules', and their sub-configs) whose use_cache is on,
    each once, the model's own config first."""
    found, seen = [], set()

    def visit(where: str, config) -> None:
        if config is None or id(config) in seen:
            return
        seen.add(id(config))
        if getattr(config, "use_cache", None):
            found.append(KVCache(where, config))
        for name in getattr(type(config), "sub_configs", None) or ():
            visit(f"{where}.{name}", getattr(config, name, None))

    visit("config", getattr(model, "config", None))  # a PeftModel's is its base model's
    for name, module in model.named_modules():
        visit(f"{name}.config" if name else "config", getattr(module, "config", None))
    return found


def disable_kv_caches(model, call: str) -> list:
    """Sets use_cache=False in every config caches_to_disable() finds, with a warning naming them;
    returns the (config, "use_cache", value) triples that put them back."""
    caches = caches_to_disable(model)
    if not caches:
        return []
    names = ", ".join(f"{cache.where}.use_cache=False" for cache in caches)
    warnings.warn(f"{call}: setting {names} (a KV cache cannot be filled by a recomputed layer); "
                  f"handle.remove() sets {'them' if len(caches) > 1 else 'it'} back")
    undo = [(cache.config, "use_cache", cache.config.use_cache) for cache in caches]
    for cache in caches:
        cache.config.use_cache = False
    return undo
