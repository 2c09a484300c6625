"""The declarations' model, its JSON schema and its docs table: generated files are current,
and the schema agrees with the loader on real and generated documents."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from morello_build.integration import schema
from morello_build.integration.config import ConfigError, parse_config
from morello_build.integration.config_model import (
    TARGETS,
    TUNES,
    KernelTable,
    MorelloTable,
    expected_text,
    model_keys,
)
from tests.support.paths import REPO_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ROOT = REPO_ROOT


def test_generated_files_are_current() -> None:
    assert schema.DOCS_FILE.is_file()
    assert set(schema.expected_files()) == {
        schema.SCHEMA_FILE,
        schema.PYPROJECT_SCHEMA_FILE,
        schema.DOCS_FILE,
    }
    stale = schema.stale_files()
    assert not stale, f"stale: {stale}; run python -m morello_build.integration.schema --write"


def test_check_reports_a_stale_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    edited = tmp_path / "morello.schema.json"
    edited.write_text(schema.SCHEMA_FILE.read_text().replace('"native"', '"nativ"', 1))
    monkeypatch.setattr(schema, "SCHEMA_FILE", edited)
    assert schema.main(["--check"]) == 1
    assert str(edited) in capsys.readouterr().out
    assert schema.main(["--write"]) == 0
    assert schema.main(["--check"]) == 0
    assert json.loads(edited.read_text()) == schema.json_schema()


def test_docs_table_lists_every_key_once() -> None:
    table = schema.docs_table()
    for model in (MorelloTable, KernelTable):
        for k in model_keys(model):
            assert k.info.doc and expected_text(k)
            assert f"| `{k.name}` |" in table
    assert table.count("| `target` |") == 2 and table.count("| `name` |") == 1


def test_docs_name_every_allowed_value() -> None:
    """Adding an ISA or a tuning fails here until the model's docs say what it is."""
    docs = {k.name: k.info.doc for k in model_keys(MorelloTable)}
    for isa in TARGETS:
        assert f'"{isa}"' in docs["target"]
    for tune in TUNES:
        assert f'"{tune}"' in docs["tune"]
    tunings = (ROOT / "docs" / "configuration.md").read_text().split("## Tunings", 1)[1]
    for tune in TUNES:
        assert f"| `{tune}` |" in tunings


def test_conditions_name_earlier_keys() -> None:
    """A key's variants and `only_with` depend on keys the loader has checked before it."""
    for model in (MorelloTable, KernelTable):
        names = [k.name for k in model_keys(model)]
        for i, k in enumerate(model_keys(model)):
            ons = [v.on for v in k.info.variants]
            ons += [k.info.only_with[0]] if k.info.only_with else []
            assert all(on in names[:i] for on in ons), (k.name, ons)


def test_alternatives_name_model_keys() -> None:
    """An alternative form's keys exist, and its key comes before the keys whose variants
    it chooses (the loader has checked it by then)."""
    for model in (MorelloTable, KernelTable):
        names = [k.name for k in model_keys(model)]
        for a in model.ALTERNATIVES:
            assert {a.key, *a.with_keys, *a.replaced} <= set(names), a
            assert names.index(a.key) < min(names.index(n) for n in a.with_keys)


def test_docs_name_every_pipeline_function() -> None:
    from morello_build.ir.expr import FUNCTIONS

    doc = next(k for k in model_keys(KernelTable) if k.name == "expr").info.doc
    for name in FUNCTIONS:
        assert f"`{name}`" in doc, name


def test_docs_name_every_op() -> None:
    from morello_build.integration.config_model import OPS

    doc = next(k for k in model_keys(KernelTable) if k.name == "op").info.doc
    for op in OPS:
        assert f'`"{op}"`' in doc


def test_schema_lists_the_loader_keys() -> None:
    top = schema.json_schema()
    assert list(top["properties"]) == [
        "target",
        "tune",
        "verify",
        "remote_cache",
        "remote_cache_mode",
        "kernel",
    ]
    kernel = top["definitions"]["kernel"]
    assert list(kernel["properties"]) == [k.name for k in model_keys(KernelTable)]
    assert top["additionalProperties"] is False and kernel["additionalProperties"] is False
    assert top["properties"]["target"]["anyOf"][0]["enum"] == list(TARGETS)
    assert kernel["properties"]["tune"]["enum"] == list(TUNES)
    assert kernel["properties"]["layouts"]["default"] == ["row", "row", "row"]


# -- the schema against the loader (needs jsonschema, in the test extra) --------------------

GOOD = """
target = "avx2"
tune = "zen3"
verify = false

[[kernel]]
name = "mm64"
shape = [64, 64, 64]

[[kernel]]
name = "mv"
shape = [1, 2048, 4096]
dtype = "bf16"
target = ["avx512", "avx2", "x86-64"]

[[kernel]]
name = "bmm"
shape = [4, 8, 16, 32]
dtypes = ["bf16", "bf16", "f32"]
layouts = ["row", "col", "row"]
accumulate = true
threads = 2
tune = "native"
schedule = "my_pkg.schedules:tile_mm"

[[kernel]]
name = "sm"
op = "softmax"
shape = [32, 2048]

[[kernel]]
name = "gelu_b"
op = "gelu"
shape = [16, 256]
dtype = "bf16"
threads = 2
target = ["avx2", "x86-64"]
tune = "zen3"

[[kernel]]
name = "bias"
op = "add_row"
shape = [64, 3072]

[[kernel]]
name = "scale_b"
op = "mul_col"
shape = [16, 40]
dtype = "bf16"
threads = 2

[[kernel]]
name = "mlp_up"
expr = "gelu(x @ w + b)"
inputs = { x = [64, 768], w = [768, 3072], b = [3072] }

[[kernel]]
name = "proj_t"
expr = "relu(x @ w.T + b) * s"
inputs = { x = [8, 16], w = [24, 16], b = [24], s = [8, 1] }
dtype = "bf16"
threads = 2
target = ["avx2", "x86-64"]
"""

K = '[[kernel]]\nname = "mm"\nshape = [4, 4, 4]\n'
ROW = '[[kernel]]\nname = "sm"\nop = "softmax"\nshape = [8, 16]\n'
PIPE = (
    '[[kernel]]\nname = "mlp"\nexpr = "relu(x @ w + b)"\n'
    "inputs = { x = [8, 16], w = [16, 24], b = [24] }\n"
)

#: Documents the loader rejects for an unknown key, a value not allowed or a wrong type:
#: the schema must reject each one too. (Not a float dim such as 4.0: JSON schema counts it
#: an integer.)
REJECTED = [
    'targets = "avx2"\n' + K,
    K + "shpae = [1, 2, 3]\n",
    'target = "sse4"\n' + K,
    'target = ["avx2", "avx2"]\n' + K,
    'target = ["native", "avx2"]\n' + K,
    "target = []\n" + K,
    'tune = "zen9"\n' + K,
    "verify = 1\n" + K,
    'kernel = "mm"\n',
    "kernel = []\n",
    'target = "avx2"\n',
    "[[kernel]]\nshape = [4, 4, 4]\n",
    '[[kernel]]\nname = "mm"\n',
    '[[kernel]]\nname = "2mm"\nshape = [4, 4, 4]\n',
    '[[kernel]]\nname = "mm__avx2"\nshape = [4, 4, 4]\n',
    K + 'op = "conv"\n',
    K.replace("[4, 4, 4]", "[4, 0, 4]"),
    K.replace("[4, 4, 4]", "[4, 4]"),
    K.replace("[4, 4, 4]", "[2147483648, 1, 1]"),
    K + 'dtype = "f16"\n',
    K + 'dtypes = ["bf16", "f32", "f32"]\n',
    K + 'dtype = "f32"\ndtypes = ["f32", "f32", "f32"]\n',
    K + 'layouts = ["row", "diag", "row"]\n',
    K + 'layouts = "row"\n',
    K + 'accumulate = "yes"\n',
    K + "threads = 0\n",
    K + "threads = 1025\n",
    K + 'target = "AVX2"\n',
    K + 'tune = ["zen3"]\n',
    K + 'schedule = "not a callable"\n',
    K + 'schedule = ".rel:f"\n',
    # Row operations: shape [rows, n]; the matmul-only keys are refused.
    ROW.replace("[8, 16]", "[4, 4, 4]"),
    ROW.replace("[8, 16]", "[4]"),
    ROW.replace("[8, 16]", "[0, 16]"),
    ROW.replace("[8, 16]", "[2147483648, 1]"),
    ROW + 'layouts = ["row", "row", "row"]\n',
    ROW + "accumulate = false\n",
    ROW + 'dtypes = ["f32", "f32", "f32"]\n',
    ROW + 'schedule = "m:f"\n',
    ROW + 'dtype = "f16"\n',
    ROW.replace("softmax", "gelu_exact"),
    # Broadcast ops (x + b, x * b): as the other row ops.
    ROW.replace("softmax", "add_row").replace("[8, 16]", "[8, 16, 4]"),
    ROW.replace("softmax", "mul_col").replace("[8, 16]", "[16]"),
    ROW.replace("softmax", "add_col") + 'layouts = ["row", "row", "row"]\n',
    ROW.replace("softmax", "mul_row") + "accumulate = false\n",
    ROW.replace("softmax", "add_row") + 'dtype = "f16"\n',
    ROW.replace("softmax", "add_rows"),
    # Pipelines: expr with inputs, neither without the other, none of op, shape, ...
    PIPE.replace("{ x = [8, 16], w = [16, 24], b = [24] }", "[8, 16]"),
    PIPE.replace("[16, 24]", "[0, 24]"),
    PIPE.replace("[16, 24]", "[2, 16, 24]"),
    PIPE.replace("[16, 24]", "[2147483648, 24]"),
    PIPE.replace("{ x = [8, 16], w = [16, 24], b = [24] }", "{}"),
    PIPE.replace("b = [24]", "out = [24]"),
    PIPE.replace("b = [24]", '"b 2" = [24]'),
    PIPE.replace("b = [24]", "lambda = [24]"),
    PIPE.replace('"relu(x @ w + b)"', "3"),
    PIPE.split("inputs")[0],
    '[[kernel]]\nname = "mlp"\nshape = [8, 16, 24]\ninputs = { x = [8, 16] }\n',
    PIPE + 'op = "relu"\n',
    PIPE + "shape = [8, 16, 24]\n",
    PIPE + 'dtypes = ["f32", "f32", "f32"]\n',
    PIPE + 'layouts = ["row", "row", "row"]\n',
    PIPE + "accumulate = false\n",
    PIPE + 'schedule = "m:f"\n',
    PIPE + 'dtype = "f16"\n',
]


@pytest.fixture(scope="module")
def validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft7Validator.check_schema(schema.json_schema())
    jsonschema.Draft7Validator.check_schema(schema.pyproject_schema())
    return jsonschema.Draft7Validator(json.loads(schema.SCHEMA_FILE.read_text()))


def _loads(text: str) -> dict[str, Any]:
    return tomllib.loads(text)


def _loader_accepts(doc: dict[str, Any]) -> bool:
    try:
        parse_config(doc, path=Path("morello.toml"))
    except ConfigError:
        return False
    return True


def test_schema_accepts_real_declarations(validator: Any) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    doc = _loads(GOOD)
    assert _loader_accepts(doc)
    validator.validate(doc)
    example = _loads((ROOT / "example_project" / "pyproject.toml").read_text())
    validator.validate(example["tool"]["morello"])
    pyproject = jsonschema.Draft7Validator(json.loads(schema.PYPROJECT_SCHEMA_FILE.read_text()))
    pyproject.validate(example)
    pyproject.validate({"project": {"name": "x"}})  # other tables and no [tool.morello]: open
    assert not pyproject.is_valid({"tool": {"morello": {**doc, "extra": 1}}})


@pytest.mark.parametrize("text", REJECTED)
def test_schema_rejects_what_the_loader_rejects(validator: Any, text: str) -> None:
    doc = _loads(text)
    assert not _loader_accepts(doc)
    assert not validator.is_valid(doc)


_VALUES: dict[str, list[Any]] = {
    "name": ["mm", "k2", "float", "main", "_x", "", 7],
    "op": ["matmul", "conv", "softmax", "gelu", "exp", "add_row", "mul_col"],
    "shape": [
        [4, 4, 4],
        [2, 3, 4, 5],
        [4],
        [0, 4, 4],
        [2**31, 1, 1],
        [10**6] * 3,
        [8, 16],
        [2**31 - 1] * 2,
        [0, 16],
    ],
    "dtype": ["f32", "bf16", "f16"],
    "dtypes": [["f32", "f32", "f32"], ["bf16", "bf16", "f32"], ["bf16", "f32", "f32"]],
    "layouts": [["row", "col", "row"], ["col"] * 3, ["row"]],
    "accumulate": [True, False, 1],
    "threads": [1, 4, 1024, 0, 1025, True],
    "target": ["avx2", ["avx512", "avx2"], ["native"], ["native", "avx2"], "sse", []],
    "tune": list(TUNES) + ["zen9"],
    "schedule": ["m:f", "a.b:c", "m.f", 3],
}


_PIPELINE_VALUES: dict[str, list[Any]] = {
    "expr": ["relu(x @ w + b)", "gleu(x @ w + b)", "", 3],
    "inputs": [
        {"x": [8, 16], "w": [16, 24], "b": [24]},
        {"x": [8, 16], "w": [16, 24]},
        {"x": [8, 0], "w": [16, 24], "b": [24]},
        {},
        [8, 16],
    ],
    "op": ["matmul", "relu"],
    "shape": [[8, 16, 24], [8, 24]],
    "dtype": ["f32", "bf16", "f16"],
    "layouts": [["row", "row", "row"]],
    "accumulate": [False],
    "threads": [1, 2, 0],
}


def test_schema_never_rejects_what_the_loader_accepts(validator: Any) -> None:
    """Generated documents: a loaded one is valid under the schema; one the schema rejects
    fails to load (the schema is a subset of the loader's checks, never stricter)."""
    rng = random.Random(32)
    loaded = 0
    for _ in range(600):
        top: dict[str, Any] = {}
        for name in rng.sample(["target", "tune", "verify"], rng.randint(0, 2)):
            top[name] = rng.choice(_VALUES.get(name, [True, False, "yes"]))
        kernels = []
        for i in range(rng.randint(1, 2)):
            kernel: dict[str, Any] = {"name": f"k{i}", "shape": [4, 4, 4]}
            for name in rng.sample(list(_VALUES), rng.randint(0, 3)):
                kernel[name] = rng.choice(_VALUES[name])
            kernels.append(kernel)
        doc = {**top, "kernel": kernels}
        if _loader_accepts(doc):
            loaded += 1
            assert validator.is_valid(doc), doc
    assert loaded > 100


def test_schema_never_rejects_a_pipeline_the_loader_accepts(validator: Any) -> None:
    """Generated kernels mixing the pipeline keys with the others: a loaded document is
    valid under the schema (expr without inputs, or with op, shape... is refused by both)."""
    rng = random.Random(36)
    loaded = 0
    for _ in range(400):
        kernel: dict[str, Any] = {"name": "k"}
        for name in rng.sample(list(_PIPELINE_VALUES), rng.randint(1, 4)):
            kernel[name] = rng.choice(_PIPELINE_VALUES[name])
        doc = {"kernel": [kernel]}
        if _loader_accepts(doc):
            loaded += 1
            assert validator.is_valid(doc), doc
        elif "expr" in kernel and "shape" in kernel:
            assert not validator.is_valid(doc), doc
    assert loaded > 10
