"""The LM head and loss over chunks of tokens, without materialising the logits: chunked_loss.py
(chunked_causal_lm_loss, the autograd functions) and lm_loss.py (chunk_lm_loss: a Hugging Face
causal LM's head and loss replaced by it)."""
