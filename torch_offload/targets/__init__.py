"""Which submodules mode="modules" offloads inside, and the hooks it installs on them.

selection.py: targets (name patterns, module classes) and presets -> the modules where offloading
turns on and off; presets.py: the Megatron-style presets by Hugging Face module names;
module_offload.py: offload_modules() and its handle.
"""
