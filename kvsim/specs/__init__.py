"""What is served on what: a model as its shape (`model`) and its layers by kind (`layers`: full,
sliding, chunked, MLA, Mamba), GPUs (`gpu`), presets (`presets`, `presets_hybrid`), a model on
tensor-parallel GPUs and its KV capacity (`deployment`), vLLM 0.33's KV cache groups and start-up
figures (`kv_groups`), and Hugging Face config.json reading (`hf_config`, `hf_layers`). Imports only
the standard library and `kvsim.files`; everything else imports it.

The everyday names are re-exported here: `ModelSpec`, `GpuSpec`, `Deployment`, `get_model`, `get_gpu`,
`GIB`.
"""

from kvsim.specs.deployment import Deployment
from kvsim.specs.gpu import GpuSpec, get_gpu
from kvsim.specs.model import GIB, ModelSpec
from kvsim.specs.presets import get_model

__all__ = ["GIB", "Deployment", "GpuSpec", "ModelSpec", "get_gpu", "get_model"]
