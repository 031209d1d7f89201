"""Tiny random models of the architectures users train with torch_offload, one line each
(ARCHITECTURES), with a batch and a loss: 2 blocks per stack, width 32, 16 tokens, fp32.

Each builder returns (model, batch): the model in training mode, seeded, with the library's default
dropout; the batch as keyword arguments of its forward, "target" added for a diffusers model (the
flow-matching velocity its MSE loss compares with). loss(model, batch) runs one forward.
"""
import dataclasses
from typing import Callable, Tuple

import torch
from torch import nn

VOCAB, HIDDEN, FFN, HEADS, KV_HEADS, TOKENS, BATCH = 128, 32, 64, 4, 2, 16, 2


@dataclasses.dataclass(frozen=True)
class Architecture:
    name: str  # as the support matrix shows it
    family: str  # decoder-only, MoE, vision-language, encoder-only, encoder-decoder, diffusers
    build: Callable[[], Tuple[nn.Module, dict]]
    lora_targets: object = "all-linear"  # PEFT LoraConfig(target_modules=...)


def _ids(*shape) -> torch.Tensor:
    return torch.randint(9, VOCAB, shape)  # 0-8: special tokens of the vision-language model


def _lm(config_class, model_class, **overrides):
    """A Hugging Face model trained with labels=input_ids (a causal LM shifts them, a masked LM
    does not)."""
    import transformers
    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=2,
                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=64,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    fields.update(overrides)
    config = getattr(transformers, config_class)(**fields)
    model = getattr(transformers, model_class)(config).train()
    ids = _ids(BATCH, TOKENS)
    return model, {"input_ids": ids, "labels": ids}


def _gpt2():
    return _lm("GPT2Config", "GPT2LMHeadModel", n_embd=HIDDEN, n_layer=2, n_head=HEADS, n_positions=64)


def _moe(config_class, model_class, **experts):
    return _lm(config_class, model_class, moe_intermediate_size=HIDDEN, num_experts_per_tok=2, **experts)


def _deepseek_v3():
    return _moe("DeepseekV3Config", "DeepseekV3ForCausalLM", n_routed_experts=4, n_shared_experts=1,
                first_k_dense_replace=1, n_group=1, topk_group=1, q_lora_rank=16, kv_lora_rank=16,
                qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, num_key_value_heads=HEADS)


def _t5():
    import transformers
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=FFN, num_layers=2,
                                   num_decoder_layers=2, num_heads=HEADS, decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(config).train()
    return model, {"input_ids": _ids(BATCH, TOKENS), "labels": _ids(BATCH, TOKENS // 2)}


# Qwen2.5-VL: images of 4 x 4 patches of 14 x 14 pixels, 2 frames per temporal patch, merged 2 x 2
# into 4 image tokens each, placed between the vision start and end tokens of the text.
_IMAGE, _VISION_START, _VISION_END, _GRID = 5, 7, 8, (1, 4, 4)


def _qwen2_5_vl():
    import transformers
    torch.manual_seed(0)
    text = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=2,
                num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=64,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = dict(depth=2, hidden_size=HIDDEN, intermediate_size=FFN, num_heads=HEADS, out_hidden_size=HIDDEN,
                  fullatt_block_indexes=[1])
    config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=_IMAGE,
                                           video_token_id=6, vision_start_token_id=_VISION_START,
                                           vision_end_token_id=_VISION_END)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).train()
    patches = _GRID[0] * _GRID[1] * _GRID[2]
    image_tokens = patches // 4
    text_tokens = TOKENS - image_tokens - 2
    ids = torch.cat([_ids(BATCH, text_tokens // 2), torch.full((BATCH, 1), _VISION_START),
                     torch.full((BATCH, image_tokens), _IMAGE), torch.full((BATCH, 1), _VISION_END),
                     _ids(BATCH, text_tokens - text_tokens // 2)], dim=1)
    pixels = torch.randn(BATCH * patches, 3 * 2 * 14 * 14)
    return model, {"input_ids": ids, "labels": ids, "pixel_values": pixels,
                   "image_grid_thw": torch.tensor([_GRID] * BATCH)}


def _flux():
    from diffusers import FluxTransformer2DModel
    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=2, num_single_layers=2,
                                   attention_head_dim=HIDDEN // 2, num_attention_heads=2, joint_attention_dim=HIDDEN,
                                   pooled_projection_dim=HIDDEN, axes_dims_rope=(4, 6, 6)).train()
    image, text = TOKENS, 8
    batch = {"hidden_states": torch.randn(BATCH, image, 8), "encoder_hidden_states": torch.randn(BATCH, text, HIDDEN),
             "pooled_projections": torch.randn(BATCH, HIDDEN), "timestep": torch.rand(BATCH),
             "img_ids": torch.randn(image, 3), "txt_ids": torch.zeros(text, 3), "target": torch.randn(BATCH, image, 8)}
    return model, batch


def _wan():
    from diffusers import WanTransformer3DModel
    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=HIDDEN // 2,
                                  in_channels=4, out_channels=4, text_dim=HIDDEN, freq_dim=HIDDEN, ffn_dim=FFN,
                                  num_layers=2).train()
    latents = (BATCH, 4, 2, 4, 8)  # 2 frames of 4 x 8 latents: 16 tokens after the 1 x 2 x 2 patches
    batch = {"hidden_states": torch.randn(latents), "timestep": torch.rand(BATCH) * 1000,
             "encoder_hidden_states": torch.randn(BATCH, 8, HIDDEN), "target": torch.randn(latents)}
    return model, batch


_DIFFUSERS_LORA = ["to_q", "to_k", "to_v", "to_out.0"]

# One line per architecture: its name in the table, its family, the tiny model and batch.
ARCHITECTURES = [
    Architecture("Llama", "decoder-only", lambda: _lm("LlamaConfig", "LlamaForCausalLM")),
    Architecture("Mistral", "decoder-only", lambda: _lm("MistralConfig", "MistralForCausalLM")),
    Architecture("Qwen2", "decoder-only", lambda: _lm("Qwen2Config", "Qwen2ForCausalLM")),
    Architecture("Qwen3", "decoder-only", lambda: _lm("Qwen3Config", "Qwen3ForCausalLM", head_dim=8)),
    Architecture("Gemma2", "decoder-only", lambda: _lm("Gemma2Config", "Gemma2ForCausalLM", head_dim=8)),
    Architecture("Gemma3", "decoder-only", lambda: _lm("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=8)),
    Architecture("Phi3", "decoder-only", lambda: _lm("Phi3Config", "Phi3ForCausalLM")),
    Architecture("GPT-NeoX", "decoder-only", lambda: _lm("GPTNeoXConfig", "GPTNeoXForCausalLM")),
    Architecture("GPT-2", "decoder-only", _gpt2),
    Architecture("OLMo", "decoder-only", lambda: _lm("OlmoConfig", "OlmoForCausalLM")),
    Architecture("OLMo2", "decoder-only", lambda: _lm("Olmo2Config", "Olmo2ForCausalLM")),
    Architecture("Qwen3-MoE", "MoE", lambda: _moe("Qwen3MoeConfig", "Qwen3MoeForCausalLM", num_experts=4,
                                                  head_dim=8)),
    Architecture("Mixtral", "MoE", lambda: _moe("MixtralConfig", "MixtralForCausalLM", num_local_experts=4)),
    Architecture("DeepSeek-V3", "MoE", _deepseek_v3),
    Architecture("Qwen2.5-VL", "vision-language", _qwen2_5_vl),
    Architecture("BERT", "encoder-only", lambda: _lm("BertConfig", "BertForMaskedLM")),
    Architecture("T5", "encoder-decoder", _t5),
    Architecture("Flux", "diffusers", _flux, _DIFFUSERS_LORA),
    Architecture("Wan", "diffusers", _wan, _DIFFUSERS_LORA),
]


def is_diffusers(model: nn.Module) -> bool:
    return hasattr(model, "enable_gradient_checkpointing") and not hasattr(model, "gradient_checkpointing_enable")


def loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """The training loss: the model's own (labels) or, for a diffusers model, flow matching's MSE."""
    inputs = {k: v for k, v in batch.items() if k != "target"}
    if "target" not in batch:
        return model(**inputs).loss
    return nn.functional.mse_loss(model(**inputs, return_dict=False)[0], batch["target"])


def enable_own_checkpointing(model: nn.Module) -> None:
    """The model's own gradient checkpointing (torch's non-reentrant checkpoint of every block)."""
    if is_diffusers(model):
        model.enable_gradient_checkpointing()
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
