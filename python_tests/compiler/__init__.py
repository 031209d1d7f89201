"""torch_offload/compiler/: compile(), the partitioner, projection policies in compiled graphs,
the Hugging Face mask and logits changes."""
