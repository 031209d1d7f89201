"""The values trainer configs use for activation offloading, as apply() arguments.

axolotl: `activation_offloading: true | legacy | disk | hidden_states` (and false / absent), plus
`layer_offloading: true`; TRL: `activation_offloading=True`. Mapped to our modes:
true -> "all", legacy -> "sync", disk -> "disk", hidden_states -> "hidden_states".
"""
from typing import Optional

_ACTIVATION_OFFLOADING = {
    True: "all",
    "true": "all",
    "all": "all",
    "legacy": "sync",
    "sync": "sync",
    "disk": "disk",
    "hidden_states": "hidden_states",
    False: None,
    "false": None,
    None: None,
}


def from_config(activation_offloading=None, layer_offloading: bool = False) -> dict:
    """apply() arguments {"mode": ..., "layer_offloading": ...} for a trainer config's values.

    Strings are case-insensitive ("True" from a YAML string works). Raises ValueError naming the
    config key for an unknown value, and when neither kind of offloading is on.
    """
    key = activation_offloading.lower() if isinstance(activation_offloading, str) else activation_offloading
    if key not in _ACTIVATION_OFFLOADING:
        known = ", ".join(repr(k) for k in _ACTIVATION_OFFLOADING if isinstance(k, str))
        raise ValueError(f"torch_offload.integrations.from_config: unknown activation_offloading="
                         f"{activation_offloading!r}; expected True, False or one of {known}")
    mode: Optional[str] = _ACTIVATION_OFFLOADING[key]
    if not isinstance(layer_offloading, bool):
        raise ValueError(f"torch_offload.integrations.from_config: layer_offloading must be true or "
                         f"false, got {layer_offloading!r}")
    if mode is None and not layer_offloading:
        raise ValueError("torch_offload.integrations.from_config: activation_offloading is off and "
                         "layer_offloading is false: nothing to turn on")
    return {"mode": mode, "layer_offloading": layer_offloading}
