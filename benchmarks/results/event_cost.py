import time, torch, sys
sys.path.insert(0, ".")
import torch_offload
from torch_offload._ops import offload_save
s = torch.cuda.current_stream()
def per(f, n=200):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): f()
    r = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return round(r, 2)
for blocking in (False, True):
    evs = []
    print("create+record blocking=%s" % blocking, per(lambda: evs.append(torch.cuda.Event(blocking=blocking)) or evs[-1].record(s)))
    print("re-record blocking=%s" % blocking, per(lambda: evs[0].record(s)))
    print("destroy blocking=%s" % blocking, per(lambda: evs.pop()))
m = torch_offload.OffloadManager(max_in_flight=0); mid = m.id()
x = torch.empty(1 << 19, dtype=torch.bfloat16, device="cuda")
print("save dropped at once (fences recycle)", per(lambda: offload_save(x, mid)))
m.synchronize()
hs = []
print("save kept (200 live)", per(lambda: hs.append(offload_save(x, mid))))
m.synchronize(); hs.clear()
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
for _ in range(300): a @ a
print("save kept, GPU busy", per(lambda: hs.append(offload_save(x, mid))))
m.synchronize(); hs.clear()
for _ in range(300): a @ a
print("save dropped, GPU busy", per(lambda: offload_save(x, mid)))
m.synchronize()
