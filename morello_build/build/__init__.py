"""Build integration: kernel declarations, the generate step, CMake glue, Python bindings."""

from __future__ import annotations

from morello_build.build.config import ConfigError, KernelDecl, MorelloConfig, load_config
from morello_build.build.generate import cmake_dir, cmake_dir_main, generate_main

__all__ = [
    "ConfigError",
    "KernelDecl",
    "MorelloConfig",
    "cmake_dir",
    "cmake_dir_main",
    "generate_main",
    "load_config",
]
