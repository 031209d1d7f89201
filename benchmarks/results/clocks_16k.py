"""Issue 10: do hidden_states' 16k steps run at other GPU clocks than checkpointing's? Interleaved
rounds of checkpointing / hidden_states / hidden_states with every save kept on the GPU, each
variant's timed steps marked with wall-clock times, while `nvidia-smi -lms 100` logs the SM clock,
power and clock-event reasons (run it beside this script, see session13_gpu_calls.sh); the
analysis (clocks_16k_analyse.py) averages the log over each variant's windows.

python3 benchmarks/results/clocks_16k.py [SEQ] [ROUNDS]"""
import json
import sys
import time

import torch

sys.path.insert(0, ".")
import torch_offload  # noqa: E402
from benchmarks.common import reference_from_argv  # noqa: E402

seq, rounds, model, ids = reference_from_argv(16384, 4)


def hf_checkpointing():
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.gradient_checkpointing_disable


VARIANTS = {
    "ckpt": hf_checkpointing,
    "hidden": lambda: torch_offload.apply(model, "hidden_states").remove,
    "hidden_nocopy": lambda: torch_offload.apply(model, "hidden_states", keep_on_device_bytes=int(1e12)).remove,
}


def step():
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


for r in range(rounds):
    for name, enable in VARIANTS.items():
        undo = enable()
        step()
        torch.cuda.synchronize()
        start = time.time()
        times = []
        for _ in range(4):
            t = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(round(time.perf_counter() - t, 4))
        print(json.dumps({"round": r, "variant": name, "start": start, "end": time.time(), "steps_s": times}),
              flush=True)
        undo()
