import time, torch, statistics, warnings
warnings.filterwarnings("ignore")
from transformers import LlamaConfig, LlamaForCausalLM
torch.set_num_threads(1)
cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=24, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa", use_cache=False)
torch.manual_seed(0); model = LlamaForCausalLM(cfg).train()
ids = torch.randint(0, 256, (1, 16))
def step():
    model.zero_grad(set_to_none=True); model(input_ids=ids, labels=ids).loss.backward()
def measure(n=40):
    for _ in range(5): step()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3
r = {"none": measure()}
for re in (False, True):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": re}); r[f"ckpt_reentrant={re}"] = measure(); model.gradient_checkpointing_disable()
print({k: round(v, 1) for k, v in r.items()})
