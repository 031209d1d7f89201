"""Where the host time of a 4k modules `*.self_attn` step goes (GPU machine): median step times of
plain training and of modules mode, then one modules step under cProfile (our Python hooks and the
ops they call, by own time) and one under torch's profiler (the top CPU ops by self time, the CUDA
runtime calls).

python3 benchmarks/results/modules_host_profile_4k.py [SEQ]"""
import cProfile
import io
import pstats
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
import torch_offload  # noqa: E402
from benchmarks.common import REFERENCE, build_llama, timed_steps  # noqa: E402

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
model = build_llama(REFERENCE, "cuda", seq)
ids = torch.randint(0, REFERENCE["vocab"], (1, seq), device="cuda")


def step():
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


def median_step(n=7):
    return timed_steps(step, n, seq, "cuda")["step_s"]


for _ in range(2):
    step()
plain = median_step()
handle = torch_offload.apply(model, "modules", targets=["*.self_attn"])
for _ in range(2):
    step()
ours = median_step()
print(f"seq {seq}: plain {plain * 1e3:.1f} ms, modules {ours * 1e3:.1f} ms, ratio {ours / plain:.3f}", flush=True)

profiler = cProfile.Profile()
torch.cuda.synchronize()
profiler.enable()
step()
torch.cuda.synchronize()
profiler.disable()
text = io.StringIO()
pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
print(text.getvalue(), flush=True)

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    step()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
handle.remove()
