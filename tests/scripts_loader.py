"""A script of scripts/ or benchmarks/ imported as a module, for tests of its pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
BENCHMARKS = ROOT / "benchmarks"


def load_script(name: str, directory: Path = SCRIPTS) -> ModuleType:
    """<directory>/<name>.py as a module (registered first: dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, directory / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module."""
    return load_script(name, BENCHMARKS)
