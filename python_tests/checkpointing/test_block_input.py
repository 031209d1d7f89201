"""An in-place change of a checkpointed block's input is reported in the user's terms
(torch_offload/checkpointing/block_input.py): the block's input, its dtype, shape and device, and
the versions, not the ops the user never called."""
import pytest
import torch

import torch_offload


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_block_input_modified_in_place_names_what_the_user_did(use_reentrant):
    block = torch.nn.Linear(4, 4)
    h = torch.randn(2, 4, requires_grad=True) * 2  # a block input: an op output, as hidden states are
    out = torch_offload.checkpoint(block, h, use_reentrant=use_reentrant)
    with torch.no_grad():
        h.add_(1)
    with pytest.raises(RuntimeError) as error:
        out.sum().backward()
    message = str(error.value)
    assert message.startswith("torch_offload.checkpoint: a checkpointed block's input (a tensor saved for "
                              "backward, torch.float32 [2, 4] on cpu, ")
    assert "was modified in place after it was saved: it is at version 1; expected version 0 instead" in message
    # Ops the user never called are not named.
    assert "offload_save" not in message and "offload_restore" not in message
