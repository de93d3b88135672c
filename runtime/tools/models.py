"""Models to export: PT2E int8 quantization, torchvision architectures, a small demo CNN.

`with_batch_statistics` gives a random-weight model's batch norms statistics
measured on batches; `quantize_pt2e` quantizes a float model the way OPS.md's programs expect it:
torchao's PT2E flow with the XNNPACK quantizer's symmetric config
(per-tensor int8 activations, per-channel symmetric int8 weights),
calibrated on the given batches, and exports the result with
``torch.export``. `SmallCNN` is a residual CNN small enough for the demo and
the tests on a CPU Vulkan driver. `torchvision_model` builds a torchvision
architecture by name with random weights (nothing is downloaded). With a
CPU build of torch, PyPI's torchvision (linked against CUDA torch) fails to
import (``torchvision::nms does not exist``: its package ``__init__``
registers compiled ops); its model definitions are plain Python, so
`torchvision_package` then sets the package up without the two package
``__init__`` files that do that (also for transformers, which imports
torchvision whenever it is installed). Used by
``python -m runtime export``, the demo and the tests; torchao and
torchvision are imported only when needed.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import sys
import warnings
from importlib.util import find_spec
from pathlib import Path

import torch

from runtime.errors import EtvkError


class ModelError(EtvkError, ValueError):
    """A model that cannot be built or quantized here (unknown name, a missing package)."""


class SmallCNN(torch.nn.Module):
    """conv-relu, a residual block (conv-relu, conv, add, relu), max pool, global pool, linear."""

    def __init__(self, channels: int = 16, classes: int = 10):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.head = torch.nn.Linear(channels, classes)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        y = self.conv2(torch.relu(self.conv1(x)))
        x = torch.relu(x + y)
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


def with_batch_statistics(model: torch.nn.Module, batches: list[tuple]) -> torch.nn.Module:
    """`model` in eval mode, its batch norms' running statistics measured on `batches` (a plain
    average over them). With torchvision's initial statistics (mean 0, variance 1) the
    activations of random-weight MobileNetV2 or MnasNet fade to zero: every input would give the
    same output."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None
    model.train()
    with torch.no_grad():
        for (batch,) in batches:
            model(batch)
    return model.eval()


def quantize_pt2e(model: torch.nn.Module, example: tuple, calibration: list[tuple]):
    """The model quantized with PT2E (XNNPACK symmetric per-channel config) and exported.

    Args:
        model: a float model (put in eval mode here).
        example: example inputs (their shapes are the program's).
        calibration: input tuples to calibrate the activation ranges with.

    Returns:
        The ``torch.export.ExportedProgram`` of the quantized model.

    Raises:
        ModelError: torchao is not installed.
    """
    # torchao logs a warning for each of its CUDA kernel libraries a CPU torch cannot load, and
    # torch one for an enum torchao registers: neither concerns quantizing here.
    for noisy in ("torchao", "torch.utils._pytree"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.testing.pt2e._xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
    except ImportError as exc:
        raise ModelError(f"quantizing needs torchao ({exc}); pip install torchao") from None
    model = model.eval()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XNNPACKQuantizer is deprecated.*")
        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
        prepared = prepare_pt2e(torch.export.export(model, example).module(), quantizer)
    with torch.no_grad():
        for batch in calibration:
            prepared(*batch)
    return torch.export.export(convert_pt2e(prepared), example)


# torchvision architecture name -> the module of torchvision.models that defines it.
TORCHVISION_MODELS = {
    **{name: "resnet" for name in ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
                                   "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d",
                                   "wide_resnet50_2", "wide_resnet101_2")},
    **{name: "mnasnet" for name in ("mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3")},
    "mobilenet_v2": "mobilenetv2",
    "mobilenet_v3_small": "mobilenetv3",
    "mobilenet_v3_large": "mobilenetv3",
    **{f"efficientnet_{v}": "efficientnet" for v in ("b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7",
                                                     "v2_s", "v2_m", "v2_l")},
    **{f"regnet_{kind}_{size}": "regnet" for kind in "xy"
       for size in ("400mf", "800mf", "1_6gf", "3_2gf", "8gf", "16gf", "32gf")},
    "regnet_y_128gf": "regnet",
    **{name: "shufflenetv2" for name in ("shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5",
                                         "shufflenet_v2_x2_0")},
    **{name: "squeezenet" for name in ("squeezenet1_0", "squeezenet1_1")},
    **{name: "densenet" for name in ("densenet121", "densenet161", "densenet169", "densenet201")},
    **{name: "vgg" for name in ("vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn")},
    "alexnet": "alexnet",
    "googlenet": "googlenet",
    "inception_v3": "inception",
}
# the keyword arguments of an inference model with random weights: no auxiliary classifiers (used
# in training only) and PyTorch's default initialisation (torchvision's own is slow and warns)
_MODEL_KWARGS = {name: {"aux_logits": False, "init_weights": False} for name in ("googlenet", "inception_v3")}


def torchvision_package() -> None:
    """Makes ``import torchvision`` work where its package ``__init__`` fails (a torchvision built
    against another torch: ``torchvision::nms does not exist``): the package and its ``models``
    subpackage are then set up without their ``__init__`` files, with import specs, so that its
    model definitions and pure-Python modules import, and libraries that look for torchvision
    (transformers) find this one. Nothing happens where torchvision imports or is not installed."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return
    except RuntimeError:  # torchvision::nms does not exist: a torchvision built for another torch
        spec = find_spec("torchvision")
        root = Path(spec.submodule_search_locations[0])
        for name, folder in (("torchvision", root), ("torchvision.models", root / "models")):
            if not hasattr(sys.modules.get(name), "__path__"):
                package = importlib.util.module_from_spec(
                    importlib.machinery.ModuleSpec(name, None, is_package=True))
                package.__path__ = package.__spec__.submodule_search_locations = [str(folder)]
                package.__file__ = str(folder / "__init__.py")  # what inspect.getfile asks for
                sys.modules[name] = package
        sys.modules["torchvision"].__version__ = importlib.metadata.version("torchvision")


def _torchvision_module(module: str):
    """``torchvision.models.<module>`` (through `torchvision_package`)."""
    torchvision_package()
    if find_spec("torchvision") is None:
        raise ModelError("torchvision is not installed; pip install torchvision")
    return importlib.import_module(f"torchvision.models.{module}")


def torchvision_model(name: str) -> torch.nn.Module:
    """The torchvision architecture `name` with random weights (``weights=None``), in eval mode.

    Raises:
        ModelError: an unknown name, or torchvision missing.
    """
    if name not in TORCHVISION_MODELS:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(sorted(TORCHVISION_MODELS))}")
    module = _torchvision_module(TORCHVISION_MODELS[name])
    return getattr(module, name)(weights=None, **_MODEL_KWARGS.get(name, {})).eval()
