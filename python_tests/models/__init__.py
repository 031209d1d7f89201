"""apply() on real model code (a Hugging Face Llama, a torchvision ResNet)."""
