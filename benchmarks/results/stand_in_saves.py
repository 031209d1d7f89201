"""Issue 10 (session 18): what the stand-in (torch_offload/stand_in.py) captures from the attention call
of the reference model's layers on this GPU: each save's kind (one of the call's own tensors, or held:
offloaded or kept), and the bytes offloaded per step with the stand-in and with the dispatch-mode path
(the same outputs should go to the host either way).

    python3 benchmarks/results/stand_in_saves.py [SEQ]
"""
import importlib, os, sys
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload import stand_in
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
model = build_llama(dict(REF, layers=4), "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
seen = []
original = stand_in.run_captured


def recording(frame, store, function, args, kwargs, call_tensors):
    out = original(frame, store, function, args, kwargs, call_tensors)
    record = store.stood_in[-1]
    seen.append(None if record is None else ([kind for kind, _ in record.saves], record.out_position))
    return out


stand_in.run_captured = recording
importlib.import_module("torch_offload.attention_offload").run_captured = recording
attention = importlib.import_module("torch_offload.attention_offload")
frame_of_context = attention.frame_of_context
handle = torch_offload.apply(model, "selective", policy="attention")
for path in ("stand_in", "mode", "stand_in"):
    attention.frame_of_context = frame_of_context if path == "stand_in" else (lambda: None)
    seen.clear()
    before = handle.stats()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.cuda.synchronize()
    after = handle.stats()
    print(f"{path:9s} bytes to host per step {(after['bytes_to_host'] - before['bytes_to_host']) / 1e6:8.1f} MB, "
          f"to device {(after['bytes_to_device'] - before['bytes_to_device']) / 1e6:8.1f} MB; "
          f"first captured call: {seen[0] if seen else 'none'}")
