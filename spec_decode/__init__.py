"""spec_decode: exact speculative decoding for T5X-style encoder-decoders.

Public API:
  T5Config, t5_config(name, **overrides): model configs and T5X presets.
  init_params(config, rng): T5X-style initial parameters.
  load_t5x_checkpoint(path, config=None, dtype=None), save_t5x_checkpoint(...).
  load_hf_checkpoint(path, dtype=None): a Hugging Face T5 folder (safetensors)
    as a Model.
  Model(config, params): a model with `.logits(...)`.
  generate(model, encoder_input_tokens, *, max_decode_len, ..., draft=None,
           gamma=4): baseline decoding, or speculative decoding with a draft.
  make_mesh(num_partitions=1): a ('data', 'model') device mesh for
    `Model.shard(mesh)`.
"""

from spec_decode.checkpoints import CheckpointError
from spec_decode.checkpoints import load_t5x_checkpoint
from spec_decode.checkpoints import save_t5x_checkpoint
from spec_decode.decoding import DecodeResult
from spec_decode.device_mesh import make_mesh
from spec_decode.generation import generate
from spec_decode.hf_checkpoints import load_hf_checkpoint
from spec_decode.model import init_params
from spec_decode.model import logical_axes
from spec_decode.model import Model
from spec_decode.model import T5Config
from spec_decode.model import t5_config
from spec_decode.sampling import SamplingConfig

# Subpackages a notebook reaches for as `sd.pretrained.load(...)`,
# `sd.analysis.walltime_improvement(...)` and `sd.costs.cost_profile(...)`.
from spec_decode import analysis
from spec_decode import costs
from spec_decode import pretrained

__version__ = '0.1.0'

__all__ = [
    'CheckpointError', 'DecodeResult', 'Model', 'SamplingConfig', 'T5Config',
    'analysis', 'costs', 'generate', 'init_params', 'load_hf_checkpoint',
    'load_t5x_checkpoint', 'logical_axes', 'make_mesh', 'pretrained',
    'save_t5x_checkpoint', 't5_config',
]
