"""Text and JSON views of an Impl tree (what `morello synth` prints)."""

from __future__ import annotations

from typing import Any

from morello_build.impl.nodes import Alloc, Impl, Kernel, Loop, kind_name
from morello_build.ir.levels import Level


def node_level(node: Impl) -> str | None:
    if isinstance(node, Alloc):
        return node.tensor.level.name
    return None


def to_json(node: Impl) -> dict[str, Any]:
    """`{"kind", "spec", "level", "kernel", "action", "cost", "children"}` recursively."""
    out: dict[str, Any] = {
        "kind": kind_name(node),
        "spec": node.spec.text(),
        "level": node_level(node),
        "kernel": node.name if isinstance(node, Kernel) else None,
        "action": node.action,
        "cost": node.cost.main if node.cost else None,
        "peaks": dict(zip((lvl.name for lvl in Level), node.cost.peaks)) if node.cost else None,
        "children": [to_json(c) for c in node.children],
    }
    if isinstance(node, Loop):
        out["tile"] = list(node.tile_shape)
        out["parallel"] = node.parallel
    if isinstance(node, Alloc):
        out["tensor"] = node.tensor.text()
        out["cache_view"] = node.cache_view
    return out


def to_text(node: Impl, indent: int = 0) -> str:
    """Indented tree: one line per node with its action, Spec and cost."""
    lines: list[str] = []
    _walk(node, indent, lines)
    return "\n".join(lines)


def _walk(node: Impl, indent: int, lines: list[str]) -> None:
    cost = f"  [cost {node.cost.main}]" if node.cost else ""
    label = node.action or kind_name(node)
    if isinstance(node, Kernel) and not node.action:
        label = f"kernel {node.name}"
    lines.append(f"{'  ' * indent}{label}: {node.spec.text()}{cost}")
    for c in node.children:
        _walk(c, indent + 1, lines)


def iter_nodes(node: Impl) -> list[Impl]:
    out = [node]
    for c in node.children:
        out.extend(iter_nodes(c))
    return out
