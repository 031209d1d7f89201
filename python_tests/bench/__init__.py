"""The benchmarks: python -m torch_offload.bench (torch_offload/bench/) and the scripts of
benchmarks/."""
