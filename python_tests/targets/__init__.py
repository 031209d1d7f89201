"""torch_offload/targets/: the modules mode="modules" offloads inside, and its presets."""
