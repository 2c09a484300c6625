"""The harness's C files, kept as templates in `templates/` (package data).

Real `.c` files can be read, diffed and compiled on their own; `string.Template`
placeholders (`${name}`) leave C's braces alone. The text is filled in exactly as written:
what the harness compiles is the file plus its values, nothing else.
"""

from __future__ import annotations

import functools
from importlib import resources
from string import Template


@functools.cache
def _template(name: str) -> Template:
    text = (resources.files("morello_build.harness") / "templates" / name).read_text()
    return Template(text)


def render(name: str, **values: object) -> str:
    """The template `templates/<name>` with every `${key}` replaced by `values[key]`
    (KeyError if one is missing)."""
    return _template(name).substitute({k: str(v) for k, v in values.items()})
