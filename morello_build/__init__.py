"""morello-build: synthesize fast, verified x86 C kernels at build time.

The synthesizer follows the Morello paper (arXiv 2505.01637): a dynamic program over
program rewrites that minimizes an affine cost model, memoized in a table of boxes.
"""

from morello_build import native as _native

# First, before any other submodule: MORELLO_PURE_PYTHON=1 imports the compiled search
# core's `.py` sources (morello_build/native.py).
_native.install()

__version__ = "0.1.0"
