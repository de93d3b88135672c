"""Decoder LLMs to export: Hugging Face ``transformers`` models, quantized 8da4w, with a static cache.

`import_transformers` imports the library where the environment's
torchvision cannot be imported (PyPI's torchvision links CUDA torch; with a
CPU torch its package ``__init__`` fails, and ``transformers`` imports it
whenever it is installed): the model definitions are used as they are
(runtime.tools.models.torchvision_package gives torchvision a package without
that ``__init__``). `decoder` builds a causal LM from a preset, a
``config.json`` or a local folder with ``config.json`` and safetensors
weights (nothing is downloaded); `quantize_8da4w` applies torchao's
``Int8DynActInt4WeightQuantizer``; `export_decoder` exports it the way the
ecosystem does, ``TorchExportableModuleForDecoderOnlyLM`` with a static
cache. Used by ``python -m runtime export-llm``, the tests and the LLM
benchmark; torch and transformers are imported only when needed.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import torch

from runtime.tools.models import ModelError, torchvision_package

# Shapes of known models, with random weights (nothing is downloaded).
PRESETS = {
    "llama-3.2-1b": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=64, rope_theta=500000.0, tie_word_embeddings=True,
                         max_position_embeddings=131072),
    "tiny-llama": dict(model_type="llama", vocab_size=512, hidden_size=128, intermediate_size=256,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=256),
}


def import_transformers():
    """The ``transformers`` module, importable beside a torchvision built for another torch.

    Raises:
        ModelError: transformers is not installed.
    """
    for noisy in ("torchao", "torch.utils._pytree", "transformers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    torchvision_package()
    try:
        import transformers
    except ImportError as exc:
        raise ModelError(f"decoder models need transformers ({exc}); pip install transformers") from None
    return transformers


def decoder_config(source: str | Path, **overrides):
    """A ``transformers`` config: a preset name (`PRESETS`), a ``config.json`` file, or a folder
    holding one; `overrides` replace its fields (e.g. ``num_hidden_layers``).

    Raises:
        ModelError: an unknown preset, or a file that is not a config.
    """
    transformers = import_transformers()
    if str(source) in PRESETS:
        fields = dict(PRESETS[str(source)])
    else:
        path = Path(source)
        path = path / "config.json" if path.is_dir() else path
        try:
            fields = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelError(f"{source}: not a preset ({', '.join(PRESETS)}) nor a readable "
                             f"config.json ({exc})") from None
    fields.update({k: v for k, v in overrides.items() if v is not None})
    model_type = fields.pop("model_type", None)
    try:
        return transformers.AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError) as exc:
        raise ModelError(f"{source}: {exc}") from None


def decoder(source: str | Path, seed: int = 0, **overrides) -> torch.nn.Module:
    """A causal LM in eval mode: with the weights of a folder holding ``config.json`` and
    safetensors files, else with random weights from `decoder_config`'s config.

    Raises:
        ModelError: see `decoder_config`; a folder whose weights cannot be loaded.
    """
    transformers = import_transformers()
    path = Path(source)
    if path.is_dir() and any(path.glob("*.safetensors")):
        try:
            return transformers.AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, dtype=torch.float32, **{k: v for k, v in overrides.items()
                                                                      if v is not None}).eval()
        except (OSError, ValueError) as exc:
            raise ModelError(f"{source}: cannot load the model ({exc})") from None
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(decoder_config(source, **overrides),
                                                         dtype=torch.float32).eval()


def quantize_8da4w(model: torch.nn.Module, group_size: int = 32) -> torch.nn.Module:
    """The model with every linear quantized by torchao's 8da4w (int8 dynamic per-token activations,
    4-bit weights in groups of `group_size` along K), in the model's own dtype: an fp16 model
    (``decoder(...).half()``) gets ``precision`` and ``scales_precision`` float16, so its
    activations stay fp16.

    Raises:
        ModelError: torchao is not installed.
    """
    logging.getLogger("torchao").setLevel(logging.ERROR)
    try:
        from torchao.quantization import Int8DynActInt4WeightQuantizer
    except ImportError as exc:
        raise ModelError(f"8da4w quantization needs torchao ({exc}); pip install torchao") from None
    dtype = next(model.parameters()).dtype
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Int8DynActInt4WeightQuantizer(groupsize=group_size, precision=dtype,
                                             scales_precision=dtype).quantize(model)


def export_decoder(model: torch.nn.Module, max_cache_len: int, tokens: int = 1, dynamic: bool = False):
    """The model exported with a static KV cache of `max_cache_len` positions
    (``TorchExportableModuleForDecoderOnlyLM``, inputs ``input_ids`` and ``cache_position``):
    `tokens` token ids a call, or with `dynamic` any count from 1 to `max_cache_len`
    (``dynamic_shapes`` on both inputs)."""
    import_transformers()
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model.generation_config.cache_implementation = "static"
    module = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=max_cache_len)
    shapes = None
    if dynamic:
        count = torch.export.Dim("tokens", min=1, max=max_cache_len)
        shapes = {"input_ids": {1: count}, "cache_position": {0: count}}
        tokens = max(tokens, 2)  # an example of one token would fix the count to 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return module.export(input_ids=torch.zeros((1, tokens), dtype=torch.long),
                             cache_position=torch.arange(tokens, dtype=torch.long), dynamic_shapes=shapes)
