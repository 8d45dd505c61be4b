"""Runs the ``Example:`` blocks of the public API as doctests, and checks
that every public symbol of keras_trm.layers / models / training /
decoding / export has one.

Each module is run with ``doctest`` (ELLIPSIS | NORMALIZE_WHITESPACE) after
a fixed seed, so the examples are deterministic; they print shapes, dtypes
and exact properties, not float values that vary by machine.
"""

import contextlib
import doctest
import importlib
import os
import pathlib

import pytest

# Every library module with a doctest example runs (found, not listed, so
# a new module's examples cannot be forgotten). The serving package's
# examples need exported models and sockets; tests/test_serving*.py run the
# real thing.
_ROOT = pathlib.Path(__file__).resolve().parents[1] / "keras_trm"
MODULES = sorted(
    "keras_trm." + ".".join(path.relative_to(_ROOT).with_suffix("").parts)
    for path in _ROOT.rglob("*.py")
    if ">>>" in path.read_text(encoding="utf-8")
    and path.relative_to(_ROOT).parts[0] not in ("serving", "jobs")
)

# Under JAX and PyTorch (.ci/run's backend runs) the examples of the
# backend-neutral core run; the rest is TensorFlow by design.
CORE = ("keras_trm.layers.", "keras_trm.models.", "keras_trm.decoding.search",
        "keras_trm.training.losses", "keras_trm.training.schedules",
        "keras_trm.training.accumulation", "keras_trm.training.optimizers",
        "keras_trm.training.checkpoints", "keras_trm.data.prepared",
        "keras_trm.data.loader", "keras_trm.text.sentencepiece")
BACKEND = os.environ.get("KERAS_BACKEND", "tensorflow")
if BACKEND != "tensorflow":
    MODULES = [name for name in MODULES if name.startswith(CORE)]

PACKAGES = [
    "keras_trm.layers",
    "keras_trm.models",
    "keras_trm.training",
    "keras_trm.decoding",
    "keras_trm.export",
]

# Public symbols without an example yet: their modules belong to work done
# elsewhere (Transformer-XL model restructuring, checkpoints / distribution /
# precision / resume, LM training and evaluation, the export wrappers,
# LiteRT and CTranslate2 export). Remove a name once its docstring has an
# ``Example:`` block; a name listed here that has one fails the test too,
# so the list only shrinks.
ALLOW_MISSING = {
    # keras_trm.training: checkpoint plumbing and device setup
    "average_checkpoints", "select_checkpoint_average",
    "make_strategy", "split_cpu", "train_segments",
}

# Names re-exported from another library: the example is in the docstring of
# the keras_trm module that re-exports them.
ALIASES = {"LayerNormalization": "keras_trm.layers.layer_normalization"}

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


pytestmark = pytest.mark.portable  # CI runs it under each backend


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name):
    import keras

    module = importlib.import_module(name)
    keras.utils.set_random_seed(0)
    # PyTorch: the examples of layers, models and searches run as inference
    # (a layer's output that requires grad cannot be read by NumPy); those
    # of training fit models, which needs gradients.
    no_grad = contextlib.nullcontext()
    if (keras.backend.backend() == "torch"
            and not name.startswith("keras_trm.training.")):
        import torch

        no_grad = torch.no_grad()
    with no_grad:
        result = doctest.testmod(module, optionflags=FLAGS, verbose=False,
                                 report=True)
    assert result.attempted > 0, f"{name} has no doctest examples"
    assert result.failed == 0, f"{result.failed} example(s) failed in {name}"


def _has_example(doc):
    return bool(doc) and "Example" in doc and ">>>" in doc


def _public_symbols():
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            yield package, name, getattr(module, name)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="once, under TensorFlow")
def test_every_public_symbol_has_an_example():
    missing, listed_but_done = [], []
    for package, name, obj in _public_symbols():
        if name in ALIASES:
            doc = importlib.import_module(ALIASES[name]).__doc__
        else:
            doc = getattr(obj, "__doc__", None)
        if not callable(obj):
            continue  # constants
        has = _has_example(doc)
        if not has and name not in ALLOW_MISSING:
            missing.append(f"{package}.{name}")
        if has and name in ALLOW_MISSING:
            listed_but_done.append(f"{package}.{name}")
    assert not missing, f"public symbols without an `Example:` block: {missing}"
    assert not listed_but_done, (
        f"remove from ALLOW_MISSING (they have examples now): {listed_but_done}")


def test_example_modules_cover_the_documented_symbols():
    """Every symbol with an example lives in a module that MODULES runs."""
    not_run = []
    for package, name, obj in _public_symbols():
        if name in ALLOW_MISSING or not callable(obj):
            continue
        home = ALIASES.get(name) or getattr(obj, "__module__", "")
        if BACKEND != "tensorflow" and not home.startswith(CORE):
            continue  # TensorFlow by design: run under TensorFlow
        if home not in MODULES:
            not_run.append(f"{package}.{name} ({home})")
    assert not not_run, f"examples that no test runs: {not_run}"
