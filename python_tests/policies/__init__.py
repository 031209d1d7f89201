"""torch_offload/policies/: selective offload's policies, kept projection groups, the stand-in for
named policies."""
