"""morello-build: synthesize fast, verified x86 C kernels at build time.

The synthesizer follows the Morello paper (arXiv 2505.01637): a dynamic program over
program rewrites that minimizes an affine cost model, memoized in a table of boxes.
"""

__version__ = "0.1.0"
