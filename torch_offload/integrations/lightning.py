"""OffloadLightningCallback: a PyTorch Lightning Callback that turns offloading on when fitting
begins and undoes it when fitting ends, as OffloadCallback does for the Hugging Face Trainer.

It applies in on_fit_start, which Lightning runs after the LightningModule's configure_model and
after the strategy wrapped the model (DDP, or FSDP2's fully_shard called in configure_model under
ModelParallelStrategy): the order apply() wants. Only this module imports lightning.
"""
import sys
from typing import Optional

import torch
from lightning.pytorch import Callback

from ..apply import apply, read_options
from ..handle import OffloadHandle

_NAME = "torch_offload.integrations.OffloadLightningCallback"


class OffloadLightningCallback(Callback):
    """Trainer(callbacks=[OffloadLightningCallback("hidden_states")]): apply(model, mode, **options)
    for each fit.

    `mode` and options as for torch_offload.apply (OffloadLightningCallback("all", min_bytes=0),
    OffloadLightningCallback(None, layer_offloading=True), or an OffloadConfig), checked when the
    callback is made: a wrong mode or option raises here, naming it.

    `module`: what apply() gets, as a path of the LightningModule's submodules ("model",
    "model.backbone"; "" is the LightningModule itself). By default the Hugging Face model the
    LightningModule holds (the outermost transformers PreTrainedModel in it, so chunked_loss= finds
    its LM head and loss), else the LightningModule itself (apply() finds the blocks among its
    submodules); two Hugging Face models in it are an error asking for module=.

    `handle` is the handle while fitting runs (stats(), explain()); `stats` keeps the last fit's
    statistics after it ended. Removed at the end of fit, on an exception, and at teardown.
    """

    def __init__(self, mode="hidden_states", *, module: Optional[str] = None, **options):
        if module is not None and not isinstance(module, str):
            raise TypeError(f"{_NAME}: module={module!r}; expected the path of a submodule of the LightningModule "
                            "(a str such as 'model'), or None")
        self.mode, self.module, self.options = mode, module, options
        self.config, self._call = read_options(mode, options, _NAME)
        self.handle: Optional[OffloadHandle] = None
        self.stats: dict = {}

    def target(self, pl_module: torch.nn.Module) -> torch.nn.Module:
        """The module of `pl_module` that apply() gets (see `module` in the class's docstring)."""
        if self.module is not None:
            try:
                return pl_module.get_submodule(self.module)
            except AttributeError:
                raise ValueError(f"{self._call}: module={self.module!r}: {type(pl_module).__name__} has no "
                                 "submodule of that name") from None
        models = _hugging_face_models(pl_module)
        if len(models) > 1:
            raise ValueError(f"{self._call}: {type(pl_module).__name__} holds {len(models)} Hugging Face models "
                             f"({', '.join(models)}); name the one to offload with module=... (module='' is the "
                             "LightningModule itself)")
        return next(iter(models.values()), pl_module)

    def on_fit_start(self, trainer, pl_module):
        self._remove()  # a fit that ended without on_fit_end or on_exception
        self.handle = apply(self.target(pl_module), self.config, self.options.get("blocks"),
                            self.options.get("manager"))

    def on_fit_end(self, trainer, pl_module):
        self._remove()

    def on_exception(self, trainer, pl_module, exception):
        self._remove()

    def teardown(self, trainer, pl_module, stage):
        self._remove()

    def _remove(self):
        if self.handle is not None:
            self.stats = self.handle.stats()
            self.handle.remove()
            self.handle = None


def _hugging_face_models(module: torch.nn.Module) -> dict:
    """The outermost transformers PreTrainedModels inside `module`, by name (none where transformers
    was never imported: no such model can exist)."""
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return {}
    found = {}
    for name, child in module.named_modules():  # parents come before their children
        if isinstance(child, transformers.PreTrainedModel) and not any(
                name.startswith(outer + ".") for outer in found):
            found[name] = child
    return found


__all__ = ["OffloadLightningCallback"]
