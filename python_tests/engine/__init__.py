"""torch_offload/_library/ and the C++ engine seen from Python: the ops and OffloadManager, the
disk tier, the device window, node budgets, TorchScript."""
