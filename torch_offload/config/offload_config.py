"""OffloadConfig: everything apply() turns on for a model, as one frozen value.

    torch_offload.apply(model, OffloadConfig(SelectiveOptions(policy="attention+qkv"),
                                             layer_offloading=True, chunked_loss=True))

is what `apply(model, "selective", policy="attention+qkv", layer_offloading=True, chunked_loss=True)`
builds from its keywords; OffloadCallback, integrations.gradient_checkpointing_enable and
torch_offload.compile take the same object."""
import dataclasses
from typing import Optional, Union

from .errors import OptionTypeError
from .mode_options import MODE_OPTIONS, AutoOptions, options_type
from .parts import ChunkedLossOptions, LayerOffloadingOptions, LongContextOptions, TilingOptions

Part = Union[None, bool, dict, int]


# The parts beside the activation mode: each field of OffloadConfig and the options class it holds.
PARTS = {"layer_offloading": LayerOffloadingOptions, "chunked_loss": ChunkedLossOptions, "tiling": TilingOptions,
         "long_context": LongContextOptions}


@dataclasses.dataclass(frozen=True)
class OffloadConfig:
    """What apply() turns on.

    activations: the activation mode's options (HiddenStatesOptions, SelectiveOptions,
        ActivationsOptions ("all"), SyncOptions, DiskOptions, ModulesOptions, AutoOptions), or a
        mode's name for its defaults; None: no activation offloading (layer offloading alone).
    layer_offloading, chunked_loss, tiling: LayerOffloadingOptions, ChunkedLossOptions,
        TilingOptions (True: their defaults; chunked_loss also takes a number of tokens per chunk);
        False: off; None: long_context decides, else off.
    long_context: LongContextOptions (True: its defaults): the parts a sequence far longer than
        checkpointing fits needs, each where it applies and unless given (resolve.py).
    """

    activations: object = "hidden_states"
    layer_offloading: Optional[LayerOffloadingOptions] = None
    chunked_loss: Optional[ChunkedLossOptions] = None
    tiling: Optional[TilingOptions] = None
    long_context: Optional[LongContextOptions] = None

    def __post_init__(self):
        activations = self.activations
        if isinstance(activations, (str, bool)):
            try:
                activations = options_type(activations)()
            except ValueError as error:
                raise OptionTypeError(f"activations={self.activations!r}: {error}") from None
        if activations is not None and type(activations) not in MODE_OPTIONS:
            names = ", ".join(options.__name__ for options in MODE_OPTIONS)
            raise OptionTypeError(f"activations={activations!r}; expected a mode's options ({names}), a mode's name "
                                  "or None")
        object.__setattr__(self, "activations", activations)
        for name, part in PARTS.items():
            object.__setattr__(self, name, part.from_value(getattr(self, name)))

    def parts_on(self) -> list:
        """The names of the parts this config turns on (given, not left to long_context)."""
        return [name for name in PARTS if getattr(self, name)]

    @property
    def mode_name(self) -> Optional[str]:
        """The activation mode's name (None: no activation offloading)."""
        return None if self.activations is None else self.activations.mode_name

    @property
    def is_auto(self) -> bool:
        return isinstance(self.activations, AutoOptions)
