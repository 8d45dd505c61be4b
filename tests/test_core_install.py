"""The core install (``pip install keras_trm``, no extras) holds no server,
gRPC, Prometheus, LiteRT or plotting package, and the README's library
example trains, translates and exports with none of them importable.

* The dependency set comes from this checkout's ``pyproject.toml`` (its
  ``[project]`` table, read with ``tomllib``), so the test follows edits to
  ``pyproject.toml`` rather than a stale installed copy.
* The README example is the fenced ``python`` block under ``## The
  library`` in ``README.md``, read at test time and run unchanged in a child
  process where an import hook makes each extra's modules raise
  ``ModuleNotFoundError``, as they do where the extras are not installed.
  The suite's own environment has every extra (the ``dev`` extra), so the
  hook is what makes this a test of the core install.

That using a feature of a missing extra names the extra
(``pip install "keras_trm[serve]"``) is tested in ``tests/test_extras.py``.
"""

import ast
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Each package the core must not require, and the extra that installs it.
EXTRA_OF = {
    "flask": "serve",
    "waitress": "serve",
    "grpcio": "serve",
    "tensorflow-serving-api": "serve",
    "prometheus-client": "serve",
    "ai-edge-litert": "litert",
    "matplotlib": "plots",
}
# Their top-level import names, which the README example's child cannot import.
BLOCKED_MODULES = ("flask", "waitress", "grpc", "tensorflow_serving",
                   "prometheus_client", "ai_edge_litert", "matplotlib")

# Installed as the child's first sys.meta_path finder: importing a blocked
# module (or a submodule) raises ModuleNotFoundError, as on a core install;
# libraries that import one optionally see it missing. Each refused name is
# reported on stderr, for the failure message.
_BLOCKER = textwrap.dedent("""
    import sys

    class _MissingExtras:
        blocked = frozenset({blocked!r})

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in self.blocked:
                print("core-install test: refused import of", repr(name),
                      file=sys.stderr)
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, _MissingExtras())
""")


def _requirements(pyproject_text):
    """The ``[project]`` requirements of a ``pyproject.toml``:
    ``(core, extras)`` with ``core`` a list of ``Requirement`` and
    ``extras`` a dict from each extra to its list of ``Requirement``."""
    project = tomllib.loads(pyproject_text)["project"]
    core = [Requirement(line) for line in project.get("dependencies", [])]
    extras = {extra: [Requirement(line) for line in lines]
              for extra, lines in project.get("optional-dependencies", {}).items()}
    assert core and extras, "no requirements read from pyproject.toml"
    return core, extras


def _metadata(pyproject_text):
    """The core and per-extra requirements of a ``pyproject.toml``:
    ``(core, extras)`` with ``core`` a set of canonical names and ``extras``
    a dict from each extra to its set of canonical names."""
    core, extras = _requirements(pyproject_text)
    return ({canonicalize_name(r.name) for r in core},
            {extra: {canonicalize_name(r.name) for r in reqs}
             for extra, reqs in extras.items()})


def _pyproject():
    return (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def _problems(core, by_extra):
    """What is wrong with a dependency set: a serving / LiteRT / plotting
    package that the core requires, or that its extra does not list."""
    problems = [f"the core requires {name} (extra {extra!r})"
                for name, extra in EXTRA_OF.items() if name in core]
    problems += [f"extra {extra!r} does not list {name}"
                 for name, extra in EXTRA_OF.items()
                 if name not in by_extra.get(extra, set())]
    return problems


def test_the_core_requires_no_server_litert_or_plot_package():
    """pyproject.toml's dependencies have none of flask, waitress, grpcio,
    tensorflow-serving-api, prometheus-client, ai-edge-litert, matplotlib,
    and each is in its extra (serve, litert, plots)."""
    core, by_extra = _metadata(_pyproject())
    assert "tensorflow" in core and "keras" in core, core
    assert _problems(core, by_extra) == []


def test_a_server_package_in_the_core_is_caught():
    """The check above fails when pyproject.toml puts an extra's package in
    dependencies or drops it from its extra (its text, edited)."""
    edited = _pyproject()
    for old, new in [('"numpy",', '"numpy", "matplotlib>=3.8",'),
                     ('plots = ["matplotlib>=3.8"]', "plots = []")]:
        assert old in edited, f"pyproject.toml has no {old}: update this test's edit"
        edited = edited.replace(old, new, 1)
    assert _problems(*_metadata(edited)) == [
        "the core requires matplotlib (extra 'plots')",
        "extra 'plots' does not list matplotlib"]


def test_the_dev_extra_holds_every_feature_extra():
    """The dev extra (the suite tests every extra) takes serve, litert and
    plots through the package's own extras, so their pins live once."""
    _, extras = _requirements(_pyproject())
    own = [r for r in extras["dev"] if r.name == "keras_trm"]
    assert len(own) == 1 and own[0].extras >= {"serve", "litert", "plots"}


def readme_library_example():
    """The fenced ``python`` block under README.md's ``## The library``."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## The library\n(.*?)(?=^## |\Z)", readme,
                        re.MULTILINE | re.DOTALL)
    assert section, 'README.md has no "## The library" section'
    block = re.search(r"^```python\n(.*?)^```", section.group(1),
                      re.MULTILINE | re.DOTALL)
    assert block, 'README.md\'s "## The library" has no ```python block'
    return block.group(1)


def _run_without_extras(code, cwd, timeout, **env):
    """Runs ``code`` in a child Python (environment variables ``env`` added)
    where the extras' modules cannot be imported; returns the finished
    process."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow", **env)
    return subprocess.run(
        [sys.executable, "-c", _BLOCKER.format(blocked=BLOCKED_MODULES) + code],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_import_hook_hides_the_extras(tmp_path):
    """The child's hook works: each extra's module, installed here by the
    dev extra, is refused with ModuleNotFoundError."""
    code = textwrap.dedent(f"""
        for name in {BLOCKED_MODULES!r}:
            try:
                __import__(name)
            except ModuleNotFoundError as err:
                print("missing", err.name)
        import json  # not blocked
    """)
    child = _run_without_extras(code, tmp_path, 60)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split() == [w for name in BLOCKED_MODULES
                                    for w in ("missing", name)]


@pytest.mark.slow
def test_the_readme_library_example_runs_without_the_extras(tmp_path, data_dir):
    """README.md's library example, unchanged, builds a model, trains it,
    prints a translation list and exports a SavedModel with no server,
    gRPC, Prometheus, LiteRT or matplotlib module importable (~65 s on 2
    cores: 5 training steps, a beam search and the export)."""
    child = _run_without_extras(readme_library_example(), tmp_path, 900,
                                KERAS_TRM_DATA_DIR=str(data_dir))
    assert child.returncode == 0, (
        f"exit {child.returncode}\n{child.stdout[-2000:]}\n{child.stderr[-4000:]}")
    printed = []
    for line in child.stdout.splitlines():
        try:
            printed.append(ast.literal_eval(line.strip()))
        except (ValueError, SyntaxError):
            pass
    translations = [p for p in printed if isinstance(p, list)]
    assert translations, f"no translation list printed:\n{child.stdout[-2000:]}"
    # One string per input. After 5 unseeded training steps the search may
    # end at once (END is the likeliest first token), so it may be empty:
    # seen once in CI; the property here is that the search runs and prints.
    (translation,) = translations[-1]
    assert isinstance(translation, str)
    assert (tmp_path / "export" / "my_translator" / "1" / "saved_model.pb").is_file()
