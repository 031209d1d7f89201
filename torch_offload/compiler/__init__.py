"""torch_offload.compile(): torch.compile with our ops inside the compiled graphs.

compile_model.py: compile() (checkpointing, inductor options); model_changes.py: what compile()
changes on the model, and remove() to undo it; partitioner.py: the partition-time pass that rewrites
saved values into offload_save / offload_restore; projection_policy.py: the named
projection-group policies recognised in traced graphs; hf_causal_mask.py and hf_logits.py: the two
Hugging Face options that make compiled training leaner (sdpa_is_causal, detach_logits).
"""
