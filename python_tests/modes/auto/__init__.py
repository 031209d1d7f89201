"""torch_offload/modes/auto/: mode="auto", its plan, unchecked tail and kept products."""
