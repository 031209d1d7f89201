"""The values trainer configs use for activation offloading, as apply() arguments.

axolotl: `activation_offloading: true | legacy | disk | hidden_states` (and false / absent), plus
`layer_offloading: true`; TRL: `activation_offloading=True`. The mode names and aliases are the one
table of config/aliases.py (true -> "all", legacy -> "sync"); false and absent mean off.
"""
from ..config.mode_options import canonical_mode, mode_names

_OFF = (False, "false", None)  # activation_offloading: false, or absent


def from_config(activation_offloading=None, layer_offloading: bool = False) -> dict:
    """apply() arguments {"mode": ..., "layer_offloading": ...} for a trainer config's values.

    Strings are case-insensitive ("True" from a YAML string works). Raises ValueError naming the
    config key for an unknown value, and when neither kind of offloading is on.
    """
    key = activation_offloading.lower() if isinstance(activation_offloading, str) else activation_offloading
    if key in _OFF:
        mode = None
    else:
        try:
            mode = canonical_mode(key)
        except ValueError:
            known = ", ".join(repr(name) for name in mode_names() + ("false",))
            raise ValueError(f"torch_offload.integrations.from_config: unknown activation_offloading="
                             f"{activation_offloading!r}; expected True, False or one of {known}") from None
    if not isinstance(layer_offloading, bool):
        raise ValueError(f"torch_offload.integrations.from_config: layer_offloading must be true or "
                         f"false, got {layer_offloading!r}")
    if mode is None and not layer_offloading:
        raise ValueError("torch_offload.integrations.from_config: activation_offloading is off and "
                         "layer_offloading is false: nothing to turn on")
    return {"mode": mode, "layer_offloading": layer_offloading}
