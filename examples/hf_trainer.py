#!/usr/bin/env python3
"""Activation offloading in a Hugging Face Trainer run, turned on with one callback.

Trains the same random Llama twice with transformers' Trainer on the same in-memory data and prints
both runs' losses (equal), the engine's statistics, and on a GPU the peak device memory of each run.

--mode hidden_states (the default): both runs use the Trainer's own gradient checkpointing,
TrainingArguments(gradient_checkpointing=True, gradient_checkpointing_kwargs=...); the second adds
callbacks=[OffloadCallback("hidden_states", hf_checkpointing=True)], which runs that checkpointing
with torch_offload's checkpoint (each checkpointed layer's input in host memory), its keywords kept.
--mode all | sync | disk: the first run is plain training, the second adds OffloadCallback(MODE).
TRL's SFTTrainer is a Trainer: the same callback works there. Config values as axolotl writes them:
OffloadCallback.from_config("true" | "legacy" | "disk" | "hidden_states", layer_offloading=...).

On a GPU: an 8-layer Llama (hidden 2048) in bf16 at 4k tokens. On CPU: a tiny fp32 Llama (there is
no device memory to save there; the point is that it runs and the losses match).

    python examples/hf_trainer.py                              # GPU if there is one, else CPU
    python examples/hf_trainer.py --device cpu --mode all
"""
import argparse
import copy
import sys
import tempfile
from pathlib import Path

import torch

try:
    import torch_offload
except ImportError:  # running from a source checkout: examples/.. holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch_offload

from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from torch_offload.integrations import OffloadCallback

GPU_SIZE = dict(layers=8, hidden=2048, intermediate=5632, heads=16, kv_heads=8, vocab=32000, seq=4096, steps=4)
CPU_SIZE = dict(layers=3, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=256, seq=64, steps=3)


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n, length, vocab):
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class LossLog(TrainerCallback):
    def __init__(self):
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])


def build(size, device):
    config = LlamaConfig(vocab_size=size["vocab"], hidden_size=size["hidden"], intermediate_size=size["intermediate"],
                         num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
                         num_key_value_heads=size["kv_heads"], max_position_embeddings=size["seq"],
                         attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device)


def train(model, size, device, callbacks, out_dir, checkpointing):
    bf16 = device == "cuda"
    # The Trainer's own gradient checkpointing, with the keywords transformers passes to the checkpoint.
    checkpoint_args = dict(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False})
    args = TrainingArguments(output_dir=out_dir, use_cpu=device == "cpu", bf16=bf16, max_steps=size["steps"],
                             per_device_train_batch_size=1, learning_rate=1e-4, logging_steps=1, seed=0,
                             report_to=[], save_strategy="no", disable_tqdm=True,
                             **(checkpoint_args if checkpointing else {}))
    log = LossLog()
    trainer = Trainer(model=model, args=args, train_dataset=TokenDataset(size["steps"], size["seq"], size["vocab"]),
                      callbacks=[log, *callbacks])
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return log.losses, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mode", default="hidden_states", help="hidden_states, all, sync, disk")
    args = parser.parse_args()
    size = GPU_SIZE if args.device == "cuda" else CPU_SIZE
    checkpointing = args.mode == "hidden_states"
    if checkpointing:  # ours runs the Trainer's gradient checkpointing
        offload = OffloadCallback("hidden_states", hf_checkpointing=True)
        reference_name = "transformers' checkpointing"
    else:
        offload = OffloadCallback(args.mode, **({} if args.device == "cuda" else {"min_bytes": 0}))
        reference_name = "plain training"
    model = build(size, args.device)
    reference = copy.deepcopy(model)
    with tempfile.TemporaryDirectory() as out_dir:
        reference_losses, reference_peak = train(reference, size, args.device, [], out_dir, checkpointing)
        del reference
        losses, peak = train(model, size, args.device, [offload], out_dir, checkpointing)
    print(f"{reference_name}: losses {reference_losses}")
    print(f"offloading ({args.mode}): losses {losses}")
    if peak is not None:
        print(f"peak allocated: {reference_name} {reference_peak:.2f} GiB, offloading {peak:.2f} GiB")
    stats = offload.stats
    print(f"offloaded {stats['bytes_to_host'] / 2**20:.1f} MiB to host in {int(stats['saves'])} saves")
    if losses != reference_losses:
        sys.exit("the losses differ")


if __name__ == "__main__":
    main()
