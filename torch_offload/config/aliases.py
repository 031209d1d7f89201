"""The names trainer configs use for activation modes (axolotl's `activation_offloading: true |
legacy`, TRL's activation_offloading=True), as the modes' own names: the one alias table."""

ALIASES = {True: "all", "true": "all", "legacy": "sync"}


def unalias(mode):
    """The mode's own name for an alias (strings in any case), else `mode` (lower-cased if a string)."""
    key = mode.lower() if isinstance(mode, str) else mode
    return ALIASES.get(key, key) if isinstance(key, (str, bool)) else key
