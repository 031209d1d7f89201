"""apply() and what it returns, across the modes: a model's copies (copy.deepcopy, torch.save),
remove(), long_context=True (torch_offload/apply.py, handle.py, copy_and_pickle.py, long_context.py)."""
