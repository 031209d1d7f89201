"""One module per apply() mode. Each exposes one entry point

    apply_<mode>(model, blocks, manager, options) -> OffloadHandle

`blocks`: the list the user passed, or None (the mode finds the decoder layers when it needs them,
with handle.blocks_to_wrap); `manager`: the user's OffloadManager or None; `options`: the other
keyword arguments the user gave apply(), as a dict. apply.py maps mode names to entry points
(MODES); a new mode is a new module here plus one line there.
"""
