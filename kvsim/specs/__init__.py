"""What is served on what: a model as its shape (`model`), GPUs (`gpu`), presets (`presets`), a model on
tensor-parallel GPUs and its KV capacity (`deployment`), and Hugging Face config.json reading
(`hf_config`). Imports only the standard library and `kvsim.files`; everything else imports it.

The everyday names are re-exported here: `ModelSpec`, `GpuSpec`, `Deployment`, `get_model`, `get_gpu`,
`GIB`.
"""

from kvsim.specs.deployment import Deployment
from kvsim.specs.gpu import GpuSpec, get_gpu
from kvsim.specs.model import GIB, ModelSpec
from kvsim.specs.presets import get_model

__all__ = ["GIB", "Deployment", "GpuSpec", "ModelSpec", "get_gpu", "get_model"]
