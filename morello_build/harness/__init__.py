"""The harness: compile generated C, check it against numpy, time it against peer libraries.

Nothing here is imported by the synthesizer or the code generator; the command line and
the build's verification step import it when asked to verify or benchmark.
"""
