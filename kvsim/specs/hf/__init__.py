"""A Hugging Face config.json read as vLLM reads it: the model's shape, MoE and quantized
weights (`config`), its layer kinds (`layers`), and every field checked with transformers' and vLLM's
rules (`checks`).

May import the rest of `kvsim.specs` only.
"""
