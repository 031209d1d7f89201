"""Issue 13 (session 19): how many objects for Python's garbage collector a forward leaves alive, plain
training against modules mode (`*.self_attn`), on a 24-layer toy Llama on CPU (the development
machine): the collector's gen-0 count after the forward and the new tracked objects by type and, for
tensors, by (dtype, shape, requires_grad, has grad_fn). On CPU the saves stay on the device (kept by
the engine's filter, saved as themselves), so this shows the tensors modules mode keeps Python objects
for; the GPU's offloaded saves' handles are counted by test_save_hooks_c instead.

    python3 benchmarks/results/gc_objects_forward_cpu.py plain|modules
"""
import collections, gc, os, sys
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import build_llama

model = build_llama(dict(layers=24, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=100), "cpu", 32)
ids = torch.randint(0, 100, (1, 32))
mode = sys.argv[1] if len(sys.argv) > 1 else "modules"
if mode == "modules":
    handle = torch_offload.apply(model, "modules", targets=["*.self_attn"])
for _ in range(3):
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)
gc.collect()
gc.disable()
before = {id(o) for o in gc.get_objects()}
loss = model(input_ids=ids, labels=ids).loss
print(mode, "gen-0 count after the forward:", gc.get_count()[0])
new = [o for o in gc.get_objects() if id(o) not in before]
print(len(new), "new tracked objects:", collections.Counter(type(o).__name__ for o in new).most_common(4))
tensors = [o for o in new if isinstance(o, torch.Tensor)]
print(collections.Counter((str(t.dtype), tuple(t.shape), t.requires_grad, t.grad_fn is not None)
                          for t in tensors).most_common(12))
