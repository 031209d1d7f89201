"""apply() and what it returns, across the modes: a model's copies (copy.deepcopy, torch.save),
remove(), long_context=True (torch_offload/apply.py, handle.py, copies.py, long_context.py)."""
