"""The module inside accelerate's wrappers, found the way accelerate finds it."""
from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside accelerate's wrappers (the `.module` of DDP, DataParallel, FSDP and
    DeepSpeed's engine), found the way accelerate does (accelerate.utils.extract_model_from_parallel;
    a torch.compile wrapper is kept, as accelerate keeps it: it runs the same modules). Without
    accelerate installed, DDP and DataParallel are unwrapped."""
    try:
        from accelerate.utils import extract_model_from_parallel
    except ImportError:
        while isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        return model
    return extract_model_from_parallel(model, keep_fp32_wrapper=True)
