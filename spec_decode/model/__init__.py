"""The T5 v1.1 model: config, layers, network and the `Model` wrapper."""

from spec_decode.model.config import PRESETS
from spec_decode.model.config import T5Config
from spec_decode.model.config import t5_config
from spec_decode.model.model import check_params
from spec_decode.model.model import init_params
from spec_decode.model.model import logical_axes
from spec_decode.model.model import Model
from spec_decode.model.model import param_shapes
from spec_decode.model.model import param_shardings
from spec_decode.model.model import parameter_count
from spec_decode.model.model import shift_right
from spec_decode.model.model import truncated_model
from spec_decode.model.network import DecoderCache
from spec_decode.model.network import EncodedInputs
from spec_decode.model.network import init_cache

__all__ = [
    'DecoderCache', 'EncodedInputs', 'Model', 'PRESETS', 'T5Config',
    'check_params', 'init_cache', 'init_params', 'logical_axes',
    'param_shapes', 'param_shardings', 'parameter_count', 'shift_right',
    't5_config', 'truncated_model',
]
