"""Training over several processes (gloo on CPU): FSDP2, sequence-parallel DTensors, the rank
launcher of python_tests/support/gloo_ranks.py."""
