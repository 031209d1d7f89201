"""Run by test_manager_lifetime.py in a subprocess: saves 48 tensors of 128 MB (copies still in
flight), lets their Python objects die, then drops the handles and the manager (argv[1] says in
which order) while the copies are queued. Before the fix the manager's destructor, called with the
GIL held, waited for the releaser's thread, which waited for the GIL to drop a source: a hang."""
import gc
import sys
import time

import torch

import torch_offload

mode = sys.argv[1]
m = torch_offload.OffloadManager(max_in_flight=256)
mid = m.id()
handles = []
t = time.time()
for i in range(48):
    x = torch.randn(32 << 20, device="cuda")  # 128 MB: each copy takes ~2.5 ms
    handles.append(torch.ops.offload.offload_save(x, mid))
    del x  # the Python object dies while the pending copy (C++) still holds the tensor
print("saved", len(handles), f"{time.time()-t:.3f}s", flush=True)
if mode == "drop_handles_then_manager":
    handles.clear()
    del m
elif mode == "drop_manager_then_handles":
    del m
    handles.clear()
gc.collect()
print("dropped", f"{time.time()-t:.3f}s", flush=True)
torch.cuda.synchronize()
print("ok", flush=True)
