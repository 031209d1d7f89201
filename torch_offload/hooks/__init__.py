"""Saved-tensor hooks that offload what autograd saves (modes "all", "sync", "disk", "modules").

offload_hooks.py: offload_activations(), the hooks (C callables where built, pyext/save_hooks.cpp);
save_filter.py: the engine's decision of which saves go; saved_regions.py: what autograd keeps for a
deduplicated save, and the Python-side counters; weight_tokens.py: offloaded frozen weights saved as
tokens; nothing_offloaded.py: the warning for a step that offloaded nothing; link_budget.py: the window of
saves kept on the GPU, sized from the link each step; hook_scopes.py: hooks entered by module hooks.
"""
