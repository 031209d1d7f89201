"""Tiled against untiled training (the tiling and long-context tests): a step's loss and gradients,
compared exactly where nothing is tiled and within the tiles' summation bound where it is."""
import torch

# fp32 parameter gradients of a tiled module: the tiles' sums in another order than one matrix
# product's (a few ulps, times the square root of the number of tiles). Everything else is computed
# row by row alike: bit-equal on CPU; on CUDA the matrix-product library may pick another algorithm
# for a tile's size, so there the bound applies to every gradient.
TILE_SUM_RTOL = 1e-6
# On CUDA every gradient is compared to this bound: cuBLAS blocks a product's sums by its size, and
# the LoRA adapters' small products see relative errors just over 1e-6 between tile sizes.
CUDA_RTOL = 1e-5


def _step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_training(reference, tiled, tiled_names):
    (ref_loss, ref_grads), (loss, grads) = reference, tiled
    exact = loss.device.type == "cpu"
    assert torch.equal(loss, ref_loss) if exact else torch.allclose(loss, ref_loss, rtol=CUDA_RTOL)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        if not exact or any(name.startswith(prefix) for prefix in tiled_names):
            error = ((grad - ref_grads[name]).norm() / ref_grads[name].norm()).item()
            assert error <= (TILE_SUM_RTOL if exact else CUDA_RTOL), (name, error)
        else:
            assert torch.equal(grad, ref_grads[name]), name
