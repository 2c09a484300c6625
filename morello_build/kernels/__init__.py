"""Microkernels, one definition each: cost, applicability, scratch memory and C emitter.

`base` holds the record, one module per family declares its kernels, `registry` lists them
in the order the search enumerates them.
"""
