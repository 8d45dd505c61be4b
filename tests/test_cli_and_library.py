"""The keras-trm subcommands and their config flags, the atomic writers,
the one integer-id check, and the layering rule (models and layers import
no data loader, job or server)."""

import argparse
import ast
import dataclasses
import os
import pathlib
import subprocess
import sys
import typing

import numpy as np
import pytest
import yaml

import keras_trm
from keras_trm import cli
from keras_trm.cli import config_parser, parse_bool, parse_config
from keras_trm.utils import checks as v
from keras_trm.utils import atomic_directory, atomic_write, write_json

pytestmark = pytest.mark.portable  # CI runs it under each backend

PACKAGE = pathlib.Path(keras_trm.__file__).resolve().parent
REPO = PACKAGE.parent


# --- the layering rule ------------------------------------------------------------


def _imported_modules(path, package=None):
    """Absolute module names a file imports (relative imports resolved
    against ``package``, by default the file's own package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if package is None:
        package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


@pytest.mark.parametrize("old,new", [
    ("prepare-translation", "`keras-trm train-translation`"),
    ("train-portable", "`KERAS_BACKEND=jax keras-trm train-translation`"),
    ("export-portable", "`keras-trm export-translation --workdir DIR`")])
def test_the_removed_portable_commands_name_their_replacement(old, new, capsys):
    """The three-command route without TensorFlow (before issue #61) only
    says what replaced it, whatever its flags, and exits 2; it is no
    longer listed."""
    assert cli.main([old, "--prepared", "p", "--workdir", "w"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"keras-trm {old} was folded into {new}")
    assert err.count("\n") == 1  # one line, no usage dump or traceback
    assert old not in cli.usage() and old not in cli.COMMANDS


def test_models_and_layers_import_no_data_jobs_or_serving():
    forbidden = ("keras_trm.data", "keras_trm.jobs", "keras_trm.serving")
    checked, offences = 0, []
    for folder in ("models", "layers"):
        for path in sorted((PACKAGE / folder).glob("*.py")):
            checked += 1
            for name in _imported_modules(path):
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    offences.append(f"{path.relative_to(REPO)} imports {name}")
    assert checked >= 10
    assert offences == []


LIBRARY = ("layers", "models", "training", "decoding", "export", "data",
           "text", "utils")
APPLICATIONS = ("jobs", "serving")  # use the library; the library uses neither


def _module_name(path):
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph():
    """``{module: set of keras_trm modules it imports}`` (any depth, each
    name cut back to the module that defines it)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imported_modules(path):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def test_every_package_is_library_or_application():
    # A new package must be put on one side of the rule below.
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages == set(LIBRARY) | set(APPLICATIONS)


def _private_attribute_uses(path):
    """``(line, expression)`` of each ``obj._name`` in a file whose ``obj``
    is not ``self``/``cls`` (a reach into another object's internals)."""
    uses = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name)
                         and node.value.id in ("self", "cls"))):
            uses.append((node.lineno, ast.unparse(node)))
    return uses


def test_models_call_no_private_layer_method(tmp_path):
    """Model code builds on the layers' public API (issue #24): the cached
    decoding step is the layers' ``call_with_cache``, not a copy reaching
    into ``_project`` / ``_residual`` / ``_ffn``."""
    offences = [f"{path.relative_to(REPO)}:{line} {expr}"
                for path in sorted((PACKAGE / "models").glob("*.py"))
                for line, expr in _private_attribute_uses(path)]
    assert offences == []
    # The scan sees such a reach.
    probe = tmp_path / "probe.py"
    probe.write_text("def f(layer, x):\n    return layer._ffn(x, False)\n")
    assert _private_attribute_uses(probe) == [(2, "layer._ffn")]


def test_library_packages_import_no_job_cli_or_server():
    forbidden = ("keras_trm.jobs", "keras_trm.cli", "keras_trm.serving")
    graph = _import_graph()
    library = [m for m in graph if m.split(".")[1:2] and m.split(".")[1] in LIBRARY]
    library += ["keras_trm", "keras_trm._runtime"]  # the package, entry-point setup
    assert len(library) >= 50
    offences = [f"{m} imports {t}" for m in library for t in sorted(graph[m])
                if any(t == f or t.startswith(f + ".") for f in forbidden)]
    assert offences == []


def test_export_modules_import_no_data_loader():
    """What an export serves is the model's contract (models, text), not a
    loader's: the export package imports nothing from keras_trm.data."""
    graph = _import_graph()
    export = [m for m in graph if m.startswith("keras_trm.export")]
    assert len(export) >= 5
    assert [f"{m} imports {t}" for m in export for t in sorted(graph[m])
            if t.startswith("keras_trm.data")] == []


def test_no_two_modules_import_each_other():
    """A package and its own submodules aside (``__init__`` re-exports)."""
    graph = _import_graph()
    mutual = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a]
                     if a in graph.get(b, ())
                     and not (a.startswith(b + ".") or b.startswith(a + "."))})
    assert mutual == []


def test_import_scan_sees_every_import_form(tmp_path):
    # The scan itself must catch each way of importing a data loader.
    probe = tmp_path / "probe.py"
    probe.write_text("import keras_trm.data.imdb\n"
                     "from keras_trm import jobs\n"
                     "from ..serving import ModelServer\n"
                     "def f():\n    from keras_trm.data import batching\n")
    names = _imported_modules(probe, package="keras_trm.models")
    assert "keras_trm.data.imdb" in names
    assert "keras_trm.jobs" in names
    assert "keras_trm.serving" in names
    assert "keras_trm.data" in names


def test_matplotlib_only_in_the_plot_module():
    users = sorted(
        str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py")
        if any(n.split(".")[0] == "matplotlib" for n in _imported_modules(p)))
    assert users == ["keras_trm/training/plots.py"]


# --- train-* flags: one per config field, help, choices, YAML -------------------


@dataclasses.dataclass
class _Config:
    epochs: int = 2
    """Training epochs."""
    rate: float = 0.5
    name: str = "x"
    sizes: tuple[int, ...] = (8, 16)
    jit: bool = True
    other: bool = False
    norm: typing.Literal["batch", "layer"] = "layer"


def _parser(config_cls=_Config):
    return config_parser("demo", "A demo.", config_cls, "runs/demo")


def test_config_flags_types_and_booleans():
    parser = _parser()
    assert parse_config(parser, _Config, [])[0] == _Config()
    config, args = parse_config(parser, _Config, [
        "--epochs", "3", "--rate", "0.25", "--name", "y", "--sizes", "4, 5,",
        "--jit", "false", "--other", "--norm", "batch", "--data-dir", "d"])
    assert config == _Config(3, 0.25, "y", (4, 5), False, True, "batch")
    assert (args.data_dir, args.workdir, args.export_dir) == ("d", "runs/demo",
                                                              "export")
    for text, value in (("TRUE", True), ("1", True), ("yes", True),
                        ("off", False), ("No", False), ("0", False)):
        assert parse_config(parser, _Config, ["--jit", text])[0].jit is value
    assert parse_config(parser, _Config, ["--sizes=[1, 2]"])[0].sizes == (1, 2)
    for bad in (["--jit", "maybe"], ["--epochs", "2.5"], ["--sizes", "a,b"],
                ["--norm", "group"], ["--no-such-flag", "1"]):
        with pytest.raises(SystemExit):
            parse_config(parser, _Config, bad)
    with pytest.raises(argparse.ArgumentTypeError, match="'maybe'"):
        parse_bool("maybe")


def test_config_validate_errors_are_usage_errors(capsys):
    from keras_trm.jobs.language_model import LanguageModelConfig

    parser = _parser(LanguageModelConfig)
    with pytest.raises(SystemExit) as exit_info:
        parse_config(parser, LanguageModelConfig,
                     ["--steps", "10", "--warmup-steps", "20"])
    assert exit_info.value.code == 2
    assert "warmup_steps" in capsys.readouterr().err


@pytest.mark.parametrize("job, argv, words", [
    ("mnist", ["--epochs", "-1"], "epochs=-1"),  # was a traceback
    ("mnist", ["--validation_fraction", "1.5"], "validation_fraction=1.5"),
    ("mnist", ["--learning_rate", "0"], "learning_rate=0.0"),
    # IMDB checked only its model names: these started the job, which
    # learned a vocabulary before failing (or trained with them).
    ("imdb", ["--max_length", "0"], "max_length=0"),
    ("imdb", ["--num_heads", "3"], "num_heads=3"),
    ("imdb", ["--lstm_dropout_rate", "1"], "lstm_dropout_rate=1.0"),
    ("imdb", ["--limit", "-5"], "limit=-5"),
])
def test_classifier_jobs_refuse_bad_values_as_usage_errors(job, argv, words, capsys):
    from keras_trm.jobs import imdb, mnist

    config_cls = {"imdb": imdb.ImdbConfig, "mnist": mnist.MnistConfig}[job]
    with pytest.raises(SystemExit) as exit_info:
        parse_config(_parser(config_cls), config_cls, argv)
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err
    config_cls().validate()  # the defaults are valid


def test_a_batch_smaller_than_the_longest_pair_is_a_usage_error(capsys):
    """``--training.tokens_per_batch 1`` was a traceback after the
    vocabulary and the training data were prepared (the loader checks it);
    now the config refuses it, naming both values, before anything runs."""
    from keras_trm.jobs.translation import TranslationConfig

    parser = _parser(TranslationConfig)
    with pytest.raises(SystemExit) as exit_info:
        parse_config(parser, TranslationConfig, ["--training.tokens_per_batch", "100",
                                                 "--model.max_sequence_length", "128"])
    assert exit_info.value.code == 2
    assert "tokens_per_batch=100" in capsys.readouterr().err
    config, _ = parse_config(parser, TranslationConfig, [
        "--training.tokens_per_batch", "100", "--data.max_train_length", "100"])
    assert (config.tokens_per_batch, config.max_train_length) == (100, 100)


def test_every_recipe_uses_the_same_boolean_rule(monkeypatch, tmp_path):
    from keras_trm.jobs import imdb, language_model, mnist

    monkeypatch.chdir(tmp_path)  # the runs write runs/<name>/config.yaml
    seen = {}
    monkeypatch.setattr(mnist, "run", lambda config, **kw: seen.update(
        mnist=(config, kw)))
    monkeypatch.setattr(imdb, "run", lambda config, **kw: seen.update(
        imdb=(config, kw)))

    def fake_lm_run(config, *args, **kwargs):
        seen["lm"] = (config, args)
        raise RuntimeError("stop")  # the summary needs a real result

    monkeypatch.setattr(language_model, "run", fake_lm_run)
    workdir = str(tmp_path / "mnist_run")
    assert cli.main(["train-mnist", "--jit-compile", "false", "--epochs", "1",
                     "--norms", "layer", "--workdir", workdir]) == 0
    config, kw = seen["mnist"]
    assert config == mnist.MnistConfig(jit_compile=False, epochs=1,
                                       norms=("layer",))
    assert kw["workdir"] == workdir
    assert kw["results_dir"] is None  # the job's <workdir>/results
    written = yaml.safe_load((tmp_path / "mnist_run" / "config.yaml").read_text())
    assert written["model"]["norms"] == ["layer"]
    assert written["training"]["jit_compile"] is False
    assert cli.main(["train-imdb", "--models", "lstm", "--limit", "10"]) == 0
    assert seen["imdb"][0] == imdb.ImdbConfig(models=("lstm",), limit=10)
    assert (tmp_path / "runs" / "imdb" / "config.yaml").is_file()
    with pytest.raises(RuntimeError, match="stop"):
        cli.main(["train-lm", "--match-parameters", "false", "--steps", "7",
                  "--warmup-steps", "2", "--corpus", "ptb"])
    config, args = seen["lm"]
    assert config == language_model.LanguageModelConfig.recipe(
        "ptb", match_parameters=False, steps=7, warmup_steps=2)
    assert args[1:] == ("runs/language_model", "export", None)


def test_train_translation_help_explains_every_flag(capsys):
    from keras_trm.jobs.translation import TranslationConfig

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train-translation", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # unwrapped
    keys = cli.config_keys(TranslationConfig)
    for field in dataclasses.fields(TranslationConfig):
        assert f"--{keys[field.name]} " in text, field.name
    assert "model (--model.NAME; the old flat --NAME works too):" in text
    assert "{multi30k,wmt14,wmt14_tfds,files}" in text
    assert "{auto,float32,mixed_bfloat16,mixed_float16}" in text
    assert "Dtype policy: ``auto`` picks mixed_bfloat16" in text  # field docs
    assert ("Training pairs whose source or target ids (START/END included) "
            "are longer are dropped") in text
    assert "Deprecated: ``max_sequence_length`` and ``max_train_length``" in text
    assert "default: multi30k" in text and "default: 12" in text


@pytest.mark.parametrize("command", ["train-translation", "train-imdb",
                                     "train-mnist", "train-lm"])
def test_every_flag_has_a_help_line(command, monkeypatch):
    from keras_trm.jobs import imdb, language_model, mnist, translation

    config_cls = {"train-translation": translation.TranslationConfig,
                  "train-imdb": imdb.ImdbConfig, "train-mnist": mnist.MnistConfig,
                  "train-lm": language_model.LanguageModelConfig}[command]
    parser = _parser(config_cls)
    monkeypatch.setenv("COLUMNS", "10000")  # no line wrapping
    text = " ".join(parser.format_help().split())
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    assert all(a.help for a in actions.values())
    keys = cli.config_keys(config_cls)
    for field in dataclasses.fields(config_cls):
        # The field's docstring, then jsonargparse's type and default.
        doc = " ".join(actions[keys[field.name]].help.split())
        assert len(doc) > 10 and doc in text, field.name
        after = text[text.index(doc) + len(doc):].split(" --")[0]
        assert "default:" in after, (field.name, after)
        if typing.get_origin(field.type) is typing.Literal:
            assert "Literal[" in after, field.name


def test_yaml_config_equals_flags_and_round_trips(tmp_path):
    from keras_trm.jobs.translation import TranslationConfig

    parser = _parser(TranslationConfig)
    flags = ["--dataset", "files", "--train-source", "a.en", "--preset", "tiny",
             "--precision", "float32", "--epochs", "3", "--download", "false",
             "--workdir", str(tmp_path / "run"), "--data-dir", str(tmp_path)]
    from_flags, args = parse_config(parser, TranslationConfig, flags)
    (tmp_path / "c.yaml").write_text(
        "dataset: files\ntrain_source: a.en\npreset: tiny\nprecision: float32\n"
        f"epochs: 3\ndownload: false\nworkdir: {tmp_path / 'run'}\n"
        f"data_dir: {tmp_path}\n")
    from_yaml, yaml_args = parse_config(parser, TranslationConfig,
                                        ["--config", str(tmp_path / "c.yaml")])
    assert from_yaml == from_flags
    assert (yaml_args.workdir, yaml_args.data_dir) == (args.workdir, args.data_dir)
    # The run's resolved config re-loads to the same config and run folders.
    path = cli.write_run_config(parser, args)
    assert path == tmp_path / "run" / "config.yaml"
    written = yaml.safe_load(path.read_text())
    # In sections (issue #41): model, data, training, decoding, export.
    assert written["model"]["d_model"] == from_flags.d_model
    assert written["decoding"]["beam_size"] == from_flags.beam_size
    # Every field but those left None (jsonargparse writes no nulls).
    assert set(_flat(written)) >= {f.name for f in dataclasses.fields(TranslationConfig)
                                   if getattr(from_flags, f.name) is not None}
    assert written["data_dir"] == str(tmp_path)
    again, again_args = parse_config(parser, TranslationConfig,
                                     ["--config", str(path)])
    assert again == from_flags
    assert parser.dump(again_args) == path.read_text()
    # Flags override the file, wherever --config stands; both spellings.
    assert parse_config(parser, TranslationConfig,
                        ["--epochs", "5", "--config", str(path)])[0].epochs == 5
    assert parse_config(parser, TranslationConfig,
                        ["--training.epochs", "6", "--config", str(path)])[0].epochs == 6
    # A file in sections, and one mixing both spellings (the section wins).
    (tmp_path / "nested.yaml").write_text(
        "data: {dataset: files, train_source: a.en, download: false}\n"
        "preset: tiny\ntraining: {precision: float32, epochs: 3}\n"
        f"epochs: 9\nworkdir: {tmp_path / 'run'}\ndata_dir: {tmp_path}\n")
    nested, _ = parse_config(parser, TranslationConfig,
                             ["--config", str(tmp_path / "nested.yaml")])
    assert nested == from_flags


def _flat(written):
    """A config.yaml's keys with its sections' keys lifted to the top."""
    flat = {}
    for key, value in written.items():
        flat.update(value if key in ("data", "model", "training", "decoding",
                                     "export") else {key: value})
    return flat


def test_the_old_max_length_flag_sets_both_new_lengths(tmp_path, capsys):
    """Issue #41: ``--max_length`` (flag or --config key) was one length for
    the model's positions and the training filter; it still sets both
    (``--max_sequence_length``, ``--max_train_length``), says so on stderr,
    and config.yaml records the new flags (which re-run the same job)."""
    from keras_trm.jobs.translation import TranslationConfig, train_length
    from keras_trm.training.presets import apply_preset

    parser = _parser(TranslationConfig)
    run = ["--workdir", str(tmp_path / "run"), "--data-dir", str(tmp_path)]
    config, args = parse_config(parser, TranslationConfig,
                                ["--max-length", "80", "--preset", "tiny"] + run)
    err = capsys.readouterr().err
    assert "deprecated: --max_length" in err, err
    assert "--model.max_sequence_length and --data.max_train_length" in err
    assert (config.max_sequence_length, train_length(config),
            config.max_length, config.d_model) == (80, 80, None, 32)
    written = _flat(yaml.safe_load(cli.write_run_config(parser, args).read_text()))
    # max_train_length null (not written): the same as max_sequence_length.
    assert (written["max_sequence_length"], written.get("max_train_length"),
            written.get("max_length")) == (80, None, None)
    (tmp_path / "old.yaml").write_text("max_length: 48\nepochs: 2\n")
    from_yaml, _ = parse_config(parser, TranslationConfig,
                                ["--config", str(tmp_path / "old.yaml")] + run)
    assert "deprecated: --max_length" in capsys.readouterr().err
    assert (from_yaml.max_sequence_length, train_length(from_yaml),
            from_yaml.epochs) == (48, 48, 2)
    # The new flags: the filter follows the positions unless given.
    new, _ = parse_config(parser, TranslationConfig,
                          ["--max_sequence_length", "96"] + run)
    assert (new.max_train_length, train_length(new)) == (None, 96)
    new, _ = parse_config(parser, TranslationConfig,
                          ["--max_sequence_length", "96",
                           "--max_train_length", "40"] + run)
    assert (new.max_sequence_length, train_length(new)) == (96, 40)
    assert capsys.readouterr().err == ""
    # The Python API: the same, with a DeprecationWarning.
    with pytest.deprecated_call(match="sets both"):
        old = TranslationConfig(max_length=32)
    assert (old.max_sequence_length, train_length(old)) == (32, 32)
    # As the one length did: a preset's value replaces a default one.
    with pytest.deprecated_call():
        old = apply_preset(TranslationConfig(max_length=128, preset="tiny"))
    old.validate()
    assert (old.max_sequence_length, train_length(old)) == (64, 64)


def test_bad_choice_is_a_usage_error_naming_flag_and_value(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train-translation", "--precision", "float8"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "precision" in err and "float8" in err and "Traceback" not in err


def test_top_level_help_lists_the_subcommands(capsys):
    assert cli.main(["--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for command in cli.COMMANDS:
        line = next(x for x in lines if x.startswith(f"  {command} "))
        assert len(line.split()) > 3, line  # a description follows


def test_serve_batching_flag_uses_the_boolean_rule():
    parser = cli.serve_parser()
    assert parser.parse_args([]).enable_batching is False
    assert parser.parse_args(["--enable_batching"]).enable_batching is True
    assert parser.parse_args(["--enable_batching=false"]).enable_batching is False
    assert parser.parse_args(["--enable-batching", "true"]).enable_batching is True


@pytest.mark.parametrize("command", ["train-translation", "train-imdb",
                                     "train-mnist", "train-lm", "translate",
                                     "serve", "sample-lm"])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"keras-trm {command}" in capsys.readouterr().out


@pytest.mark.slow
def test_entry_point_and_recipe_scripts_run_help():
    """``--help`` of the entry point and of every recipe script: the first
    thing a newcomer runs (translate_wmt14.py's once crashed at its own
    defaults)."""
    recipes = sorted((REPO / "recipes").glob("*.py"))
    assert len(recipes) >= 6
    for argv in [[sys.executable, "-m", "keras_trm.cli", "train-mnist", "--help"]] + [
            [sys.executable, str(path), "--help"] for path in recipes]:
        proc = subprocess.run(argv, capture_output=True, text=True,
                              timeout=300, cwd=REPO)
        assert proc.returncode == 0, (argv, proc.stderr[-2000:])
        assert "--data_dir" in proc.stdout or "--data-dir" in proc.stdout, argv
    assert cli.main(["no-such-command"]) == 2


def test_no_cuda_error_lines_on_a_cpu_only_machine(tmp_path):
    # A CPU-only run: TensorFlow lists its devices (apply_precision does)
    # before the missing training file stops the job.
    from keras_trm._runtime import has_nvidia_driver

    if has_nvidia_driver():
        pytest.skip("an NVIDIA driver is present")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    missing = tmp_path / "missing"
    proc = subprocess.run(
        [sys.executable, "-m", "keras_trm.cli", "train-translation",
         "--dataset", "files", "--train-source", f"{missing}.en",
         "--train-target", f"{missing}.de", "--validation-source", f"{missing}.en",
         "--validation-target", f"{missing}.de", "--download", "false",
         "--data-dir", str(tmp_path), "--workdir", str(tmp_path / "run")],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode != 0 and "missing.en" in proc.stderr, proc.stderr[-3000:]
    assert (tmp_path / "run" / "config.yaml").is_file()
    assert "cuInit" not in proc.stderr and "CUDA error" not in proc.stderr


# --- atomic writes ----------------------------------------------------------------


def test_atomic_write_round_trips_and_replaces(tmp_path):
    path = tmp_path / "a" / "b.txt"
    assert atomic_write(path, "héllo\n") == path
    assert path.read_text(encoding="utf-8") == "héllo\n"
    atomic_write(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    write_json(tmp_path / "r.json", {"bleu": 1.5, "name": "ü"})
    assert (tmp_path / "r.json").read_text(encoding="utf-8") == (
        '{\n "bleu": 1.5,\n "name": "ü"\n}\n')
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b.txt", "r.json"]
    with pytest.raises(TypeError, match="`data` must be str or bytes, got dict"):
        atomic_write(tmp_path / "c.txt", {"a": 1})
    assert not (tmp_path / "c.txt").exists()


def test_atomic_write_leaves_no_partial_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "result.json"
    atomic_write(path, "old")

    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, "new " * 1000)
    assert path.read_text() == "old"                 # the old file survives
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temp
    with pytest.raises(OSError):
        atomic_write(tmp_path / "fresh.txt", "x")
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_atomic_directory_all_or_nothing(tmp_path):
    target = tmp_path / "model" / "1"
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "saved_model.pb").write_bytes(b"half")
            raise RuntimeError("export failed")
    assert not target.exists()
    assert list((tmp_path / "model").iterdir()) == []
    with atomic_directory(target) as tmp:
        (tmp / "saved_model.pb").write_bytes(b"whole")
    assert (target / "saved_model.pb").read_bytes() == b"whole"
    with pytest.raises(FileExistsError, match="already exists"):
        with atomic_directory(target):
            pass
    with atomic_directory(target, exist_ok=True) as tmp:
        (tmp / "other").write_text("x")
    assert sorted(p.name for p in target.iterdir()) == ["other"]
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["1"]


def test_writers_go_through_the_helper(tmp_path, monkeypatch):
    # A failing rename leaves neither a vocabulary nor a checkpoint behind.
    import keras

    from keras_trm.text import save_vocabulary
    from keras_trm.training import save_weights_atomic

    def fail(src, dst):
        raise OSError("rename failed")

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="rename failed"):
        save_vocabulary(["[PAD]", "a"], tmp_path / "vocab.txt")
    with pytest.raises(OSError, match="rename failed"):
        save_weights_atomic(model, tmp_path / "w.weights.h5")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    path = save_weights_atomic(model, tmp_path / "w.weights.h5")
    other = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    other.load_weights(path)
    np.testing.assert_array_equal(other.get_weights()[0],
                                  model.get_weights()[0])
    assert [p.name for p in tmp_path.iterdir()] == ["w.weights.h5"]


# --- the one integer-id check ------------------------------------------------------


def test_integer_ids_check_names_argument_dtype_and_shape():
    import tensorflow as tf

    assert v.integer_ids("ids", np.zeros((2, 3), np.uint8)) == "uint8"
    assert v.integer_ids("ids", tf.zeros((2,), tf.int64)) == "int64"
    with pytest.raises(TypeError, match=r"`token_ids` must be integer token "
                       r"ids, got dtype float32 \(shape \(2, 5\)\)"):
        v.integer_ids("token_ids", tf.zeros((2, 5)))
    with pytest.raises(TypeError, match="`labels` must be integer class ids, "
                       "got dtype bool"):
        v.integer_ids("labels", np.zeros(3, bool), what="integer class ids")


def test_translate_names_a_path_that_is_not_a_saved_model(tmp_path, capsys):
    """``keras-trm translate --model`` with a missing path, a file, a folder
    without a SavedModel or a model base folder: exit 2 and one line that
    says what it expected (the versions found, for a base folder), before
    TensorFlow loads anything."""
    base = tmp_path / "model"
    (base / "2").mkdir(parents=True)
    (base / "2" / "saved_model.pb").write_bytes(b"")
    (base / "7").mkdir()  # a version folder without a SavedModel: not listed
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = [(tmp_path / "nope", "does not exist"),
             (tmp_path / "file.txt", "is a file"),
             (tmp_path / "empty", "has no saved_model.pb"),
             (base, f"versions [2], e.g. --model {base / '2'}")]
    for path, words in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.translate_main(["--model", str(path), "A dog."])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err and str(path) in err, err


def test_a_flag_always_wins_over_the_preset(tmp_path):
    """``--preset tiny --d_model 48 --num_heads 4`` trains with 4 heads
    although 4 is also the dataclass default; every flag of a preset given
    explicitly (values equal to the defaults included) is what runs and what
    config.yaml records; the preset fills the rest."""
    from keras_trm.jobs.translation import TranslationConfig
    from keras_trm.training.presets import apply_preset, preset

    parser = _parser(TranslationConfig)
    run = ["--workdir", str(tmp_path / "run"), "--data-dir", str(tmp_path)]
    config, args = parse_config(parser, TranslationConfig,
                                ["--preset", "tiny", "--d_model", "48",
                                 "--num_heads", "4"] + run)
    assert (config.d_model, config.num_heads) == (48, 4)
    assert (config.num_layers, config.d_ff) == (1, 64)  # from the preset
    assert apply_preset(config) == config  # the job applies nothing more
    written = _flat(yaml.safe_load(cli.write_run_config(parser, args).read_text()))
    assert (written["preset"], written["num_heads"], written["d_ff"]) == ("tiny", 4, 64)
    defaults = TranslationConfig()
    tiny = preset("tiny")
    explicit = []
    for name in tiny:
        value = getattr(defaults, name)
        explicit += [f"--{name}", str(value).lower() if isinstance(value, bool)
                     else str(value)]
    config, _ = parse_config(parser, TranslationConfig,
                             ["--preset", "tiny"] + explicit + run)
    assert {name: getattr(config, name) for name in tiny} == {
        name: getattr(defaults, name) for name in tiny}
    # The parser is left as it was: without --preset, the defaults again.
    assert parse_config(parser, TranslationConfig, run)[0].d_model == defaults.d_model


@pytest.mark.parametrize("flags, words", [
    (["--beam_size", "0"], "beam_size=0"),
    (["--epochs", "0"], "epochs=0"),
    (["--epochs", "-1"], "epochs=-1"),
    (["--time_budget_minutes", "-5"], "time_budget_minutes=-5.0"),
    (["--d_model", "30", "--num_heads", "4"], "d_model=30 and num_heads=4"),
    (["--length_penalty", "-0.5"], "length_penalty=-0.5"),
    (["--max_train_length", "200"],
     "max_train_length=200 and max_sequence_length=128"),
    (["--max_length", "0"], "max_sequence_length=0"),
])
def test_bad_training_flags_stop_before_anything_is_written(tmp_path, capsys,
                                                            flags, words):
    """Exit 2 naming the flag and the value, no traceback, no run folder."""
    workdir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        cli.train_translation_main(flags + ["--workdir", str(workdir),
                                            "--data-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err
    assert not workdir.exists()


def test_unusable_folders_stop_before_anything_is_written(tmp_path, capsys):
    """An --export_dir or --workdir that is a file (or under one) stops the
    job at once: exit 2, one error line naming the flag and the path."""
    (tmp_path / "file").write_text("x")
    for flags, words in [
            (["--export_dir", str(tmp_path / "file")], "--export_dir"),
            (["--workdir", str(tmp_path / "file" / "run")], "--workdir")]:
        args = ["--workdir", str(tmp_path / "run"), "--data-dir",
                str(tmp_path)] + flags
        with pytest.raises(SystemExit) as exit_info:
            cli.train_translation_main(args)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert words in err and "is a file" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def _recipe(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wmt14_recipe_runs_the_job_with_its_defaults_and_its_documented_command(
        tmp_path, monkeypatch, capsys):
    """recipes/translate_wmt14.py is train-translation with WMT14 and the
    paper's base preset as defaults; the command on its recipe page parses
    to the config it describes; ``--online`` is ``--dataset wmt14_tfds``,
    also in config.yaml; a flag still wins over the recipe's defaults."""
    from keras_trm.jobs import translation
    from keras_trm.jobs.translation import TranslationConfig
    from keras_trm.training.presets import preset

    seen = []
    keys = ("test_bleu", "test_tokenized_compound_split_bleu", "signature", "parameters",
            "epochs", "train_minutes", "job_minutes", "export")
    monkeypatch.setattr(translation, "run", lambda config, *a, **kw: (
        seen.append((config, kw["samples"])) or dict.fromkeys(keys, 1)))
    recipe = _recipe("translate_wmt14")
    common = ["--data-dir", str(tmp_path), "--export_dir", str(tmp_path / "export")]
    workdir = tmp_path / "wmt"
    assert recipe.main(common + ["--workdir", str(workdir)]) == 0
    config, samples = seen[-1]
    base = preset("transformer_base")
    assert config.dataset == "wmt14" and samples == recipe.SAMPLES["en"]
    assert {k: getattr(config, k) for k in base} == base
    assert '"test_tokenized_compound_split_bleu": 1' in capsys.readouterr().out
    # The recipe page's command (flat flags, as written there).
    assert recipe.main(common + ["--workdir", str(workdir), "--preset", "cpu_small",
                                 "--train-weights", "1,3", "--time-budget-minutes", "100",
                                 "--epochs", "40", "--validation-limit", "1000"]) == 0
    config = seen[-1][0]
    small = preset("cpu_small")
    assert {k: getattr(config, k) for k in small if k not in ("epochs",)} == {
        k: v for k, v in small.items() if k != "epochs"}
    assert (config.dataset, config.train_weights, config.time_budget_minutes, config.epochs,
            config.validation_limit) == ("wmt14", "1,3", 100.0, 40, 1000)
    assert recipe.main(common + ["--workdir", str(workdir), "--online",
                                 "--dataset", "multi30k"]) == 0
    assert seen[-1][0].dataset == "wmt14_tfds"
    written = yaml.safe_load((workdir / "config.yaml").read_text())
    assert written["data"]["dataset"] == "wmt14_tfds" and written["online"] is True
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        recipe.main(common + ["--online", "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["dataset"] == "wmt14_tfds" and printed["online"] is True
    assert recipe.main(common + ["--workdir", str(workdir), "--dataset", "multi30k"]) == 0
    assert seen[-1][0].dataset == "multi30k"
    assert TranslationConfig().dataset == "multi30k"  # the defaults are the recipe's own


def test_print_config_shows_the_preset_that_will_run(capsys):
    """``--print_config`` prints what runs: with ``--preset`` its values
    (and a flag over them), not the dataclass defaults."""
    from keras_trm.jobs.translation import TranslationConfig

    parser = _parser(TranslationConfig)
    for argv, d_model in (([], TranslationConfig().d_model),
                          (["--preset", "transformer_big"], 1024),
                          (["--preset", "transformer_big", "--d_model", "640"], 640)):
        with pytest.raises(SystemExit) as exit_info:
            parse_config(parser, TranslationConfig, argv + ["--print_config"])
        assert exit_info.value.code == 0
        printed = yaml.safe_load(capsys.readouterr().out)
        assert printed["model"]["d_model"] == d_model, argv
