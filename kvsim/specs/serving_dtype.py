"""vLLM's `--dtype` and `--quantization` applied to a `ModelSpec`: the bytes of weights, activations and
(with `--kv-cache-dtype auto`) the KV cache.

- `--dtype` (vllm/config/model.py `_STR_DTYPE_TO_TORCH_DTYPE`): half/float16 and bfloat16 are 2 bytes,
  float/float32 4; `auto` keeps the checkpoint's dtype.
- `--quantization`: the linear layers' weights in fewer bytes, embeddings and LM head in the model dtype
  (as `kvsim.specs.hf.config` counts a checkpoint's `quantization_config`). fp8: 1 byte; awq and gptq:
  4-bit groups of 128 with an fp16 scale and a 4-bit zero point each (their checkpoints' defaults;
  `hf_config.weight_bytes_per_param`); bitsandbytes: vLLM's in-flight 4-bit (NF4) quantization, 0.5
  byte per weight with its scales left out (docs.vllm.ai, "BitsAndBytes": a model with no
  quantization_config is quantized in flight to 4 bits). A checkpoint that is already quantized keeps
  its own figures, as vLLM reads the method from the checkpoint.

Embeddings are known for the presets below (vocab_size x hidden_size, twice when not tied, from each
model's config.json); for another model without a quantization_config every weight is quantized (an
underestimate of the weights by its embeddings' share).
"""

from __future__ import annotations

from dataclasses import replace

from kvsim.specs.hf.config import weight_bytes_per_param
from kvsim.specs.model import ModelSpec

#: `--dtype` -> bytes per element (None: the model's own).
DTYPES = {"auto": None, "half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4}
#: `--quantization` -> bytes per quantized weight.
QUANTIZATIONS = {"fp8": 1.0, "awq": weight_bytes_per_param({"quant_method": "awq"}, "--quantization"),
                 "gptq": weight_bytes_per_param({"quant_method": "gptq"}, "--quantization"),
                 "bitsandbytes": 0.5}
#: preset -> (vocab_size, tied embeddings), from the Hugging Face config.json of each model.
PRESET_VOCAB = {"opt-13b": (50272, True), "opt-66b": (50272, True), "opt-175b": (50272, True),
                "llama-13b": (32000, False), "llama-2-7b": (32000, False), "llama-2-13b": (32000, False),
                "llama-2-70b": (32000, False), "llama-3-8b": (128256, False), "llama-3.1-8b": (128256, False),
                "llama-3-70b": (128256, False), "mistral-7b": (32000, False), "mixtral-8x7b": (32000, False),
                "qwen2.5-7b": (152064, False)}


def with_dtype(spec: ModelSpec, dtype: str | None) -> ModelSpec:
    """`spec` served with vLLM's `--dtype` (None or auto: unchanged). The KV cache follows unless
    `--kv-cache-dtype` set it; unquantized weights follow too."""
    if dtype is None:
        return spec
    key = str(dtype).lower()
    if key not in DTYPES:
        raise ValueError(f"--dtype: unknown {dtype!r}; known: {', '.join(DTYPES)}")
    return spec if DTYPES[key] is None else replace(spec, dtype_bytes=DTYPES[key])


def with_quantization(spec: ModelSpec, method: str | None) -> ModelSpec:
    """`spec` served with vLLM's `--quantization` (None: unchanged; a quantized checkpoint keeps its
    own bytes per weight)."""
    if method is None or str(method).lower() in ("", "none"):
        return spec
    key = str(method).lower()
    own = spec.quant_method
    if own is not None and not (key.startswith(own) or own.startswith(key)):   # awq -> awq_marlin is fine
        raise ValueError(f"--quantization {method}: {spec.name} is a {own} checkpoint (its config's "
                         f"quantization_config.quant_method); vLLM refuses a different method")
    if own is not None:
        return spec                               # the checkpoint's own bytes per weight
    if key not in QUANTIZATIONS:
        raise ValueError(f"--quantization: unknown {method!r}; known: {', '.join(QUANTIZATIONS)}")
    if spec.weight_bytes_per_param is not None:
        return spec
    vocab, tied = PRESET_VOCAB.get(spec.name, (0, True))
    embeddings = min(float(vocab * spec.hidden_size * (1 if tied else 2)), spec.num_params)
    return replace(spec, weight_bytes_per_param=QUANTIZATIONS[key], unquantized_params=embeddings)
