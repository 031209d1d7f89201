"""What the tests share, besides the fixtures (python_tests/conftest.py). No test file imports
another test file: a helper two test files need lives here.

devices.py: DEVICES, cuda_only, HAS_CUDA. grads.py: assert_same_grads. llama.py: the tiny Llama
and its training steps checked against plain training. compiled_graphs.py: what the compiler
tests check in the graphs. checkpoint_blocks.py: the blocks the checkpoint tests train.
torch_checkpoint_pair.py: one function through our checkpoint and torch's. selective.py: the
blocks and counts of the selective tests. tiled_training.py: tiled against untiled training.
trainer_runs.py: a tiny transformers Trainer. distribution.py: what the packaging tests share.
gloo_ranks.py: gloo process groups on CPU (single_rank_mesh, run_ranks), and what the ranks run:
fsdp2_cases.py, tp_cases.py. manager_drop_script.py: a script run in a subprocess."""
