"""Build integration: kernel declarations, the generate step, CMake glue, Python bindings."""

from __future__ import annotations

from morello_build.integration.commands import cmake_dir, cmake_dir_main, generate_main
from morello_build.integration.config import ConfigError, KernelDecl, MorelloConfig, load_config

__all__ = [
    "ConfigError",
    "KernelDecl",
    "MorelloConfig",
    "cmake_dir",
    "cmake_dir_main",
    "generate_main",
    "load_config",
]
