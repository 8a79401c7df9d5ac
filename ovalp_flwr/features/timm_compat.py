"""Import timm next to a torchvision whose compiled ops cannot load.

The registry's torchvision 0.28.0 wheel is a CUDA build: beside CPU torch 2.13.0 its `_C.so`
cannot load (it links libtorch_cuda.so), and `torchvision/_meta_registrations.py` then kills the
import by registering fake kernels for the missing `torchvision::*` ops; timm imports torchvision,
so `import timm` dies too. `import_timm()` retries with that one module stubbed out: the pure-Python
parts timm uses work, and a compiled op, if ever called, raises torchvision's own "Couldn't load
custom C++ ops" error. Where torchvision loads normally, nothing is patched.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types

logger = logging.getLogger(__name__)

_STUBBED = "torchvision._meta_registrations"


def import_timm() -> types.ModuleType:
    """Return the timm module, stubbing torchvision's fake-op registrations only if needed."""
    try:
        return importlib.import_module("timm")
    except RuntimeError as err:
        if "torchvision::" not in str(err):
            raise
        reason = str(err)
    _purge("torchvision", "timm")
    sys.modules[_STUBBED] = types.ModuleType(_STUBBED, "stub: torchvision C ops are absent")
    logger.info(
        "torchvision C++ ops unavailable (%s); stubbed %s so timm can import", reason, _STUBBED
    )
    return importlib.import_module("timm")


def _purge(*packages: str) -> None:
    """Drop half-imported modules so the retry starts from a clean slate."""
    for name in list(sys.modules):
        if any(name == p or name.startswith(p + ".") for p in packages):
            del sys.modules[name]
