"""``keras-trm``: command line entry points, one subcommand per recipe
(``COMMANDS``; ``keras-trm --help`` lists them).

Every ``train-*`` subcommand has one flag per field of its job's config
dataclass (``config_parser``: the field's docstring is its help, its
``typing.Literal`` values its choices). ``--config FILE.yaml`` reads the
same fields (flags override it), and every run writes its resolved config
to ``<workdir>/config.yaml``, which ``--config`` runs again. The
``recipes/*.py`` scripts call the same functions.
"""

import argparse
import dataclasses
import importlib
import itertools
import json
import math
import os
import pathlib
import sys
import typing
import warnings

from keras_trm._runtime import (
    quiet_cuda_probe,
    quiet_tensorflow_start,
    tune_allocator,
)

# Sentences translated at the end of train-translation, by source language.
SAMPLES = {
    "en": ("A man in a blue shirt is standing on a ladder cleaning windows.",
           "Two dogs are playing in the snow."),
    "de": ("Ein Mann in einem blauen Hemd steht auf einer Leiter.",
           "Zwei Hunde spielen im Schnee."),
}


# --- train-* flags: one per config field (jsonargparse) ------------------------


def config_parser(prog, description, config_cls, workdir, results_dir=True,
                  report_only=False):
    """The ``jsonargparse`` parser of a ``train-*`` command: ``--config``,
    ``--data_dir``, ``--workdir``, ``--export_dir`` (and ``--results_dir``,
    ``--report_only``), then one flag per field of the dataclass
    ``config_cls`` with the field's docstring as help and its ``Literal``
    values as choices. Parse with :func:`parse_config`.

    Example:

    >>> import dataclasses, typing
    >>> @dataclasses.dataclass
    ... class Config:
    ...     epochs: int = 2
    ...     \"\"\"Training epochs.\"\"\"
    ...     sizes: tuple[int, ...] = (8, 16)
    ...     norm: typing.Literal["batch", "layer"] = "layer"
    >>> parser = config_parser("demo", "A demo.", Config, "runs/demo")
    >>> parse_config(parser, Config, ["--sizes", "4,5", "--norm", "batch"])[0]
    Config(epochs=2, sizes=(4, 5), norm='batch')
    """
    from jsonargparse import ActionConfigFile, ArgumentParser, set_parsing_settings

    lists = [f for f in dataclasses.fields(config_cls)
             if typing.get_origin(f.type) is tuple and f.default]
    example = ""
    if lists:  # the first list field is the example
        key, values = config_keys(config_cls)[lists[0].name], lists[0].default
        example = (f" lists are comma-separated (--{key} {','.join(map(str, values))})"
                   f" or YAML ([{', '.join(map(str, values))}]).")
    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # the help lines
    parser = ArgumentParser(prog=prog, description=(
        f"{description} Flags: dashes and underscores are the same (--data-dir = "
        "--data_dir); booleans take true|false (a bare flag means true);"
        f"{example} --config FILE.yaml reads the same keys (e.g. a run's "
        "<workdir>/config.yaml); flags on the command line override it."))
    parser.add_argument(
        "--config", action=ActionConfigFile,
        help="YAML file of these flags (a run's <workdir>/config.yaml re-runs "
             "it); flags on the command line override it")
    parser.add_argument(
        "--data_dir", type=typing.Optional[str], default=None,
        help="data folder (default: $KERAS_TRM_DATA_DIR, then ../shared/data "
             "beside the checkout, then the download cache ~/keras_trm_data)")
    parser.add_argument(
        "--workdir", type=str, default=workdir,
        help="run folder: vocabulary, checkpoints, logs, config.yaml")
    parser.add_argument("--export_dir", type=str, default="export",
                        help="SavedModels go to <export_dir>/<model>/<version>/")
    if results_dir:
        parser.add_argument(
            "--results_dir", type=typing.Optional[str], default=None,
            help="report folder (default: <workdir>/results; pass "
                 f"docs/results/{pathlib.Path(workdir).name} to update the "
                 "report kept in the repository)")
    if report_only:
        parser.add_argument(
            "--report_only", action="store_true",
            help="only rewrite the report and plots from the results already "
                 "in --workdir")
    fields = {f.name for f in dataclasses.fields(config_cls)}
    sections = getattr(config_cls, "SECTIONS", {})
    others = fields - set().union(*sections.values())
    for section, names in [*sections.items(), (None, others)]:
        parser.add_class_arguments(config_cls, nested_key=section, as_group=True,
                                   skip=fields - set(names))
        group = parser.groups.get(section or config_cls.__name__)
        if sections and group is not None:
            group.title = (f"{section} (--{section}.NAME; the old flat --NAME works too)"
                           if section else "other settings")
            group.description = None
    return parser


def config_keys(config_cls):
    """``{field: key}``: where each field of ``config_cls`` sits in the
    parsed namespace and in YAML: ``section.field`` for a field in the
    class's ``SECTIONS`` (``{section: field names}``), else its name.

    Raises:
        ValueError: a section names a field the class does not have, or a
            field is in two sections.

    Example:

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Config:
    ...     d_model: int = 256
    ...     seed: int = 0
    ...     SECTIONS = {"model": ("d_model",)}
    >>> config_keys(Config)
    {'d_model': 'model.d_model', 'seed': 'seed'}
    """
    keys = {f.name: f.name for f in dataclasses.fields(config_cls)}
    for section, names in getattr(config_cls, "SECTIONS", {}).items():
        for name in names:
            if keys.get(name) != name:
                problem = "is in two sections" if name in keys else "is not a field"
                raise ValueError(f"{config_cls.__name__}.SECTIONS[{section!r}]: "
                                 f"{name!r} {problem}")
            keys[name] = f"{section}.{name}"
    return keys


def normalize_argv(argv, kinds, aliases=None):
    """The command line ``argv`` in the spelling ``config_parser`` parses.

    ``kinds`` maps option names (underscores) to ``"bool"``, ``"tuple"``,
    ``"flag"`` (no value) or ``"value"``; ``aliases`` maps an old name to
    its new one (``d_model`` -> ``model.d_model``). Known options lose their
    dashes (``--data-dir`` -> ``--data_dir``), a bare boolean gets ``true``,
    ``1``/``0`` become ``true``/``false``, a tuple's comma list a YAML list
    (``4,5,`` -> ``[4,5]``); every ``--config FILE`` moves to the front, so
    the other flags override it.

    Example:

    >>> normalize_argv(["--batch-sizes", "128, 8", "--jit-compile",
    ...                 "--config=c.yaml"],
    ...                {"batch_sizes": "tuple", "jit_compile": "bool",
    ...                 "config": "value"})
    ['--config=c.yaml', '--batch_sizes', '[128,8]', '--jit_compile', 'true']
    """
    argv, front, out, i = list(argv), [], [], 0
    while i < len(argv):
        token, i = argv[i], i + 1
        name, eq, value = token.partition("=")
        key = name[2:].replace("-", "_")
        key = (aliases or {}).get(key, key)
        if not token.startswith("--") or key not in kinds:
            out.append(token)
            continue
        kind, option = kinds[key], "--" + key
        if eq:
            words = [f"{option}={_value(kind, value)}"]
        elif kind == "bool" and (i == len(argv) or argv[i].startswith("--")):
            words = [option, "true"]  # a bare boolean flag
        elif kind == "flag" or i == len(argv):
            words = [option]
        else:
            words, i = [option, _value(kind, argv[i])], i + 1
        (front if key == "config" else out).extend(words)
    return front + out


def _value(kind, text):
    if kind == "bool":
        return {"1": "true", "0": "false"}.get(text.strip(), text)
    if kind == "tuple" and not text.lstrip().startswith("["):
        return "[" + ",".join(x.strip() for x in text.split(",") if x.strip()) + "]"
    return text


def parse_config(parser, config_cls, argv):
    """Parses ``argv`` with a ``config_parser``; returns ``(config,
    namespace)``: the ``config_cls`` instance and jsonargparse's namespace
    (``data_dir``, ``workdir``, ... and every field, in its section where
    the class has ``SECTIONS``: ``namespace["model.d_model"]``).

    A bad flag or value, or a config whose ``validate()`` raises
    ``ValueError``/``TypeError``, exits with status 2 and a usage message
    naming it (``SystemExit``). A sectioned field also takes its flat
    spelling (``--d_model``, a top-level ``d_model:`` key in YAML).

    The class's ``flag_defaults`` (a classmethod: fields read -> defaults)
    sets the defaults of a second reading (a preset, a corpus's recipe);
    its ``RENAMED_FIELDS`` maps an old field, still a flag and a YAML key,
    to the fields it now sets: a deprecation message on stderr names them,
    and the namespace (what config.yaml records) holds them instead.
    """
    keys = config_keys(config_cls)
    aliases = {name: key for name, key in keys.items() if key != name}
    kinds = {option[2:]: "flag" if action.nargs == 0 else "value"
             for action in parser._actions  # argparse's list of every option
             for option in action.option_strings if option.startswith("--")}
    for field in dataclasses.fields(config_cls):
        kind = typing.get_origin(field.type) or field.type
        kinds[keys[field.name]] = {bool: "bool", tuple: "tuple"}.get(kind, "value")
    argv = normalize_argv(argv, kinds, aliases)
    for i, token in enumerate(argv):
        if token.startswith("--config="):
            argv[i] = "--config=" + _sectioned_config(token[len("--config="):], aliases)
        elif i and argv[i - 1] == "--config":
            argv[i] = _sectioned_config(token, aliases)
    # --print_config prints (and exits) in the last parse, after the values
    # that flag_defaults chose became defaults.
    printing = [a for a in argv if a.split("=", 1)[0] == "--print_config"]
    namespace = parser.parse_args([a for a in argv if a not in printing])
    hook = getattr(config_cls, "flag_defaults", None)
    chosen = hook({name: namespace[key] for name, key in keys.items()}) if hook else {}
    values = {keys[k]: v for k, v in chosen.items() if k in keys}
    if printing or values:
        # Read again with those defaults: a flag (or a --config key) still
        # wins, even one equal to the dataclass default, and the namespace
        # (written to config.yaml) holds what runs.
        saved = {k: parser.get_default(k) for k in values}
        parser.set_defaults(values)
        try:
            namespace = parser.parse_args(argv)
        finally:
            parser.set_defaults(saved)  # the parser may be used again
    renamed = {old: new for old, new in getattr(config_cls, "RENAMED_FIELDS", {}).items()
               if namespace.get(keys[old]) is not None}
    for old, new in renamed.items():
        flags = " and ".join(f"--{keys[name]}" for name in new)
        print(f"{parser.prog}: deprecated: --{keys[old]} (also as a --config key) "
              f"is now {flags}; it sets {'both' if len(new) > 1 else 'it'} "
              "and will go", file=sys.stderr, flush=True)
    with warnings.catch_warnings():
        # The config's own DeprecationWarning: said just above.
        warnings.simplefilter("ignore", DeprecationWarning)
        config = config_cls(**{name: namespace[key] for name, key in keys.items()})
    for old, new in renamed.items():
        namespace[keys[old]] = None
        for name in new:
            namespace[keys[name]] = getattr(config, name)
    if "preset" in keys:
        # Applied above: the job's apply_preset must not apply it again over
        # flags that equal the dataclass defaults.
        config = dataclasses.replace(config, preset="")
    if hasattr(config, "validate"):
        try:
            config.validate()
        except (ValueError, TypeError) as err:
            parser.error(str(err))
    return config, namespace


def _sectioned_config(path, aliases):
    """The ``--config`` value ``path``, or where the file has flat keys of
    sectioned fields or ``preset: ''`` (a config.yaml of before the sections
    or the named default preset) its YAML text in sections with ``preset:
    cpu_small`` (``--config`` takes a file or YAML text)."""
    import yaml

    try:
        data = yaml.safe_load(pathlib.Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return path  # jsonargparse reports it, naming the file
    if not isinstance(data, dict) or not (data.get("preset") == "" or set(data) & set(aliases)):
        return path
    if data.get("preset") == "":
        data["preset"] = "cpu_small"
    nested = {k: v for k, v in data.items() if k not in aliases}
    for key in set(data) & set(aliases):
        section, _, name = aliases[key].rpartition(".")
        if isinstance(nested.setdefault(section, {}), dict):
            nested[section].setdefault(name, data[key])  # a sectioned key wins
    return yaml.safe_dump(nested, sort_keys=False)


def read_run_config(path, config_cls):
    """The ``config_cls`` instance that a run's ``config.yaml`` (or any
    ``--config`` file, in sections or flat) describes; keys that are not
    fields (``workdir``, ``data_dir``, ...) are left out.

    Example:

    >>> import dataclasses, tempfile, pathlib
    >>> @dataclasses.dataclass
    ... class Config:
    ...     d_model: int = 256
    ...     seed: int = 0
    ...     SECTIONS = {"model": ("d_model",)}
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "config.yaml"
    >>> _ = path.write_text("workdir: runs/x\\nmodel: {d_model: 64}\\nseed: 3\\n")
    >>> read_run_config(path, Config)
    Config(d_model=64, seed=3)
    """
    import yaml

    data = yaml.safe_load(pathlib.Path(path).read_text()) or {}
    values = {}
    for name, key in config_keys(config_cls).items():
        section, _, leaf = key.rpartition(".")
        inner = data.get(section) if section else None
        if isinstance(inner, dict) and leaf in inner:
            values[name] = inner[leaf]
        elif name in data:  # the flat spelling of before the sections
            values[name] = data[name]
    return config_cls(**values)


def write_run_config(parser, namespace):
    """Writes the resolved ``namespace`` (every field, and ``data_dir``
    resolved to a folder) as YAML to ``<workdir>/config.yaml`` (atomically);
    returns the path. ``--config`` on that file runs the same job again."""
    from keras_trm.data import resolve_data_dir
    from keras_trm.utils import atomic_write

    namespace = namespace.clone()
    namespace.data_dir = str(resolve_data_dir(namespace.data_dir, must_exist=False))
    for key in ("config", "report_only"):
        namespace.pop(key, None)
    path = pathlib.Path(namespace.workdir) / "config.yaml"
    atomic_write(path, parser.dump(namespace))
    print(f"config: {path}", flush=True)
    return path


# --- the subcommands -------------------------------------------------------------


def saved_model_problem(path, flag="--model"):
    """What is wrong with ``path`` as a SavedModel folder, in one line, or
    None: missing, a file, or a folder without ``saved_model.pb`` (for a
    model base folder, the versions found in it).

    Example:

    >>> import tempfile, pathlib
    >>> base = pathlib.Path(tempfile.mkdtemp())
    >>> (base / "3").mkdir(); (base / "3" / "saved_model.pb").touch()
    >>> saved_model_problem(base / "3") is None
    True
    >>> print(saved_model_problem(base))   # doctest: +ELLIPSIS
    --model '...' is a model base folder, not a SavedModel: pass one of its versions [3], e.g. --model .../3
    """
    folder, given = pathlib.Path(path), f"{flag} {str(path)!r}"
    expected = "a SavedModel folder export/<name>/<version>"
    if not folder.exists():
        return f"{given} does not exist; expected {expected}"
    if not folder.is_dir():
        return f"{given} is a file; expected {expected}"
    if (folder / "saved_model.pb").is_file():
        return None
    versions = sorted(int(d.name) for d in folder.iterdir()
                      if d.name.isdigit() and (d / "saved_model.pb").is_file())
    if versions:
        return (f"{given} is a model base folder, not a SavedModel: pass one of "
                f"its versions {versions}, e.g. {flag} {folder / str(versions[-1])}")
    return f"{given} has no saved_model.pb: not {expected}"


def folder_problem(flag, path):
    """Why ``path`` cannot be a folder a job writes into, in one line, or
    None: it is a file, or it (or its nearest existing parent) is not
    writable. Nothing is created.

    Example:

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> folder_problem("--workdir", root / "new" / "run") is None
    True
    >>> (root / "f").write_text("x")
    1
    >>> print(folder_problem("--export_dir", root / "f"))  # doctest: +ELLIPSIS
    --export_dir '...f' is a file, not a folder
    """
    path = existing = pathlib.Path(path)
    if path.exists() and not path.is_dir():
        return f"{flag} {str(path)!r} is a file, not a folder"
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{flag} {str(path)!r}: {str(existing)!r} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{flag} {str(path)!r}: {str(existing)!r} is not writable"
    return None


def translate_main(argv):
    """Translate sentences with an exported translation SavedModel."""
    parser = argparse.ArgumentParser(
        prog="keras-trm translate",
        description="Translate sentences with a raw-text SavedModel exported "
        "by train-translation: the sentences given, or stdin's lines, read and "
        "translated --batch_size at a time (a file of any length).")
    parser.add_argument("--model", required=True,
                        help="SavedModel folder export/<name>/<version>")
    parser.add_argument("--batch_size", type=number(int, 1), default=64,
                        help="sentences per call of the model (default 64)")
    parser.add_argument("sentences", nargs="*",
                        help="source sentences (default: read stdin lines)")
    args = parser.parse_args(argv)
    problem = saved_model_problem(args.model)
    if problem:
        parser.exit(2, f"{parser.prog}: error: {problem}\n")
    quiet_cuda_probe()
    import tensorflow as tf
    importlib.import_module("tensorflow_text")  # registers the tokenizer ops

    serve = tf.saved_model.load(args.model).signatures.get("serving_default")
    specs = None if serve is None else (serve.structured_input_signature[1],
                                        serve.structured_outputs)
    if not specs or any(len(side) != 1 or any(s.dtype != tf.string for s in side.values())
                        for side in specs):
        signature = specs and tuple({k: s.dtype.name for k, s in side.items()}
                                    for side in specs)
        parser.exit(2, f"{parser.prog}: error: --model {args.model!r} is not a "
                       "translation SavedModel (serving_default: one string input, "
                       f"one string output); its serving_default (inputs, outputs): "
                       f"{signature}\n")
    lines = iter(args.sentences or (line.rstrip("\n") for line in sys.stdin))
    while batch := list(itertools.islice(lines, args.batch_size)):
        (out,) = serve(tf.constant(batch, tf.string)).values()
        for line in out.numpy():
            print(line.decode("utf-8"))
        sys.stdout.flush()
    return 0


def train_translation_main(argv, prog="keras-trm train-translation", workdir="runs/multi30k",
                           defaults=None, samples=None, online_flag=False,
                           summary_keys=("test_bleu", "parameters", "epochs", "train_minutes",
                                         "job_minutes", "export")):
    """Train a Transformer translator, report sacreBLEU, export it.

    For the recipes: ``defaults`` maps TranslationConfig fields to values
    (a flag still wins), ``samples`` a source language to the sentences
    translated at the end, ``online_flag`` adds ``--online`` (``--dataset
    wmt14_tfds``), ``summary_keys`` are the result's keys printed. Returns
    0; a bad flag, folder or corpus exits with status 2 and a usage
    message, before anything is written.
    """
    from keras_trm.jobs.translation_config import TranslationConfig

    parser = config_parser(
        prog, "Train a Transformer on Multi30k EN->DE (default), WMT14 or "
        "your own parallel files, either direction; report sacreBLEU, export "
        "a raw-text SavedModel.", TranslationConfig, workdir,
        results_dir=False)
    keys = config_keys(TranslationConfig)
    if defaults:
        parser.set_defaults({keys[name]: value for name, value in defaults.items()})
    if online_flag:
        parser.add_argument("--online", action="store_true",
                            help="the full WMT14 training data from tfds: the same as "
                                 "--dataset wmt14_tfds")
        if "--online" in argv:
            # Last, so it wins over a --dataset; parsed, so that
            # --print_config and config.yaml show it.
            argv = list(argv) + [f"--{keys['dataset']}=wmt14_tfds"]
    config, args = parse_config(parser, TranslationConfig, argv)
    problem = (folder_problem("--workdir", args.workdir)
               or folder_problem("--export_dir", args.export_dir))
    if problem:
        parser.error(problem)
    # After the flags are read: --help starts no TensorFlow.
    from keras_trm.data import CorpusError
    from keras_trm.jobs.translation import run

    quiet_cuda_probe()
    write_run_config(parser, args)
    try:
        result = run(config, args.data_dir, args.workdir, args.export_dir,
                     samples=(samples or SAMPLES).get(config.source_language, ()))
    except CorpusError as err:
        # From run's first step (check_inputs), before anything is prepared.
        parser.error(str(err))
    print(json.dumps({k: result[k] for k in summary_keys}, indent=1))
    return 0


def parse_bool(text):
    """``"true"``/``"false"`` (and 1/0, yes/no, on/off, any case) -> bool;
    ``serve``'s boolean flags.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse turns it into a
            usage error naming the flag).

    Example:

    >>> parse_bool("True"), parse_bool("off")
    (True, False)
    """
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def number(cast, low=None, high=None):
    """An argparse ``type``: a finite ``cast`` (``int`` or ``float``) in
    ``[low, high]`` (None: no bound); anything else (NaN and infinity
    included) is a usage error naming the flag.

    Example:

    >>> number(int, 0, 65535)("8500"), number(float, 0.0)("2.5")
    (8500, 2.5)
    """
    kind = "an integer" if cast is int else "a finite number"
    bound = (f" in [{low}, {high}]" if high is not None
             else f" >= {low}" if low is not None else "")

    def parse(text):
        try:
            value = cast(text)
        except ValueError:
            value = math.nan
        if (not math.isfinite(value) or (low is not None and value < low)
                or (high is not None and value > high)):
            raise argparse.ArgumentTypeError(f"expected {kind}{bound}, got {text!r}")
        return value
    return parse


def serve_parser():
    """``keras-trm serve``'s flags: ``tensorflow_model_server``'s own names
    (``--model_base_path``; the dashed ``--model-base-path`` works too)."""
    parser = argparse.ArgumentParser(
        prog="keras-trm serve",
        description="Serve export folders on TF Serving's REST and gRPC APIs "
        "(same flags as tensorflow_model_server).")

    def flag(name, **kwargs):
        names = dict.fromkeys(["--" + name, "--" + name.replace("_", "-")])
        parser.add_argument(*names, dest=name, **kwargs)

    flag("port", type=number(int, 0, 65535), default=8500, help="gRPC port (default 8500)")
    flag("rest_api_port", type=number(int, 0, 65535), default=8501,
         help="REST port (default 8501; 0 serves no REST)")
    flag("model_name", action="append", default=[],
         help="model name in requests (default: the base path's folder name); "
         "repeat with --model_base_path for several models")
    flag("model_base_path", action="append", default=[],
         help="folder of <version>/ SavedModels; repeatable")
    flag("model_config_file", default=None,
         help="text ModelServerConfig (several models, version policies, labels)")
    flag("enable_batching", type=parse_bool, nargs="?", const=True, default=False,
         metavar="{true,false}", help="merge concurrent requests into batched calls")
    flag("batching_parameters_file", default=None,
         help="text BatchingParameters (max_batch_size, batch_timeout_micros, "
         "num_batch_threads, max_enqueued_batches, allowed_batch_sizes)")
    flag("file_system_poll_wait_seconds", type=number(float), default=1.0,
         help="seconds between scans for new versions (0: once, <0: never)")
    flag("rest_api_num_threads", type=number(int, 1), default=32,
         help="REST worker threads (default 32)")
    flag("grpc_max_threads", type=number(int, 1), default=32, help="gRPC worker threads")
    flag("host", default="127.0.0.1",
         help="interface to bind (default 127.0.0.1; 0.0.0.0 in a container)")
    flag("max_request_bytes", type=number(int, 1), default=4 * 1024 * 1024,
         help="largest REST body / gRPC message (default 4 MiB; more gets 413)")
    flag("max_request_rows", type=number(int, 1), default=4096,
         help="most rows (instances) in one request, checked before any "
         "value is expanded (default 4096; more gets INVALID_ARGUMENT / 400)")
    flag("tensorflow_intra_op_parallelism", type=int, default=0,
         help="threads within one TensorFlow op (0: one per core); 1 serves "
         "many concurrent requests faster")
    flag("tensorflow_inter_op_parallelism", type=int, default=0,
         help="TensorFlow ops run at once (0: one per core)")
    flag("tensorflow_session_parallelism", type=int, default=0,
         help="both pools, where the two flags above are 0")
    flag("monitoring_config_file", default=None,
         help="text MonitoringConfig: prometheus_config { enable: true path: "
         "\"/monitoring/prometheus/metrics\" } serves TF Serving's metrics on "
         "the REST port")
    flag("shutdown_grace_seconds", type=number(float, 0.0), default=30.0,
         help="on SIGTERM, how long in-flight requests may take to finish")
    return parser


def serve_main(argv):
    """Serve SavedModels on TF Serving's REST and gRPC APIs."""
    import logging

    args = serve_parser().parse_args(argv)
    quiet_cuda_probe()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from keras_trm.serving import (
            ModelManager, ModelServer, batching_options,
            configure_tensorflow_threads, model_server_config, monitoring_path)
    except ImportError as err:  # the [serve] extra is not installed
        sys.exit(f"keras-trm serve: error: {err}")

    try:
        threads = configure_tensorflow_threads(
            args.tensorflow_intra_op_parallelism, args.tensorflow_inter_op_parallelism,
            args.tensorflow_session_parallelism)
        config = model_server_config(args.model_name, args.model_base_path,
                                     args.model_config_file)
        if args.batching_parameters_file and not args.enable_batching:
            # TF Serving refuses it too (model_servers/server.cc).
            raise ValueError("--batching_parameters_file is set without "
                             "--enable_batching")
        batching = (batching_options(args.batching_parameters_file)
                    if args.enable_batching else None)
        metrics_path = monitoring_path(args.monitoring_config_file)
        if metrics_path is not None and not args.rest_api_port:
            raise ValueError("--monitoring_config_file serves metrics on the REST "
                             "port; --rest_api_port is 0")
    except ValueError as err:
        print(f"keras-trm serve: {err}", file=sys.stderr)
        return 2
    manager = ModelManager(config, batching,
                           file_system_poll_wait_seconds=args.file_system_poll_wait_seconds)
    server = ModelServer(
        manager, rest_api_port=args.rest_api_port or None, grpc_port=args.port,
        monitoring_path=metrics_path, **{k: getattr(args, k) for k in (
            "host", "rest_api_num_threads", "grpc_max_threads", "max_request_bytes",
            "max_request_rows")})
    try:
        server.serve_forever(grace=args.shutdown_grace_seconds, exit_after_grace=True,
                             info={"tensorflow_threads": threads})
    except (OSError, ValueError) as err:
        # Start-up failures (a base path that is not a folder, a port in
        # use); ModelServer.start stops what it started.
        print(f"keras-trm serve: {err}", file=sys.stderr)
        return 1
    return 0


def _classifier_command(name, config_name, summary, description):
    """``keras-trm train-<name>``: the job ``keras_trm.jobs.<name>``."""
    def main(argv, prog=f"keras-trm train-{name}"):
        job = importlib.import_module(f"keras_trm.jobs.{name}")
        config_cls = getattr(job, config_name)
        parser = config_parser(prog, description, config_cls, f"runs/{name}",
                               report_only=True)
        config, args = parse_config(parser, config_cls, argv)
        if args.report_only:
            results_dir = args.results_dir or pathlib.Path(args.workdir) / "results"
            job.write_report(args.workdir, results_dir, config)
            return 0
        quiet_cuda_probe()
        write_run_config(parser, args)
        job.run(config, data_dir=args.data_dir, workdir=args.workdir,
                export_dir=args.export_dir, results_dir=args.results_dir)
        return 0

    main.__doc__ = summary
    return main


train_imdb_main = _classifier_command(
    "imdb", "ImdbConfig", "IMDB sentiment: Transformer encoder, LSTM_LN and LSTM classifiers.",
    "IMDB sentiment with a Transformer encoder, LSTM_LN and LSTM: test accuracy on the "
    "25,000 test reviews, LSTM vs LSTM_LN curves, raw-text SavedModels.")
train_mnist_main = _classifier_command(
    "mnist", "MnistConfig", "MNIST LeNet without / with BatchNorm / with LayerNorm.",
    "MNIST LeNet without / with BatchNorm / with LayerNorm at two batch sizes: test "
    "accuracy, convergence plots, SavedModels.")


def train_lm_main(argv, prog="keras-trm train-lm"):
    """Transformer-XL vs a vanilla Transformer language model."""
    from keras_trm.jobs.language_model_config import LanguageModelConfig

    parser = config_parser(
        prog, "Train Transformer-XL and a vanilla Transformer LM on the same "
        "segments, report test bpc/perplexity, export Transformer-XL.",
        LanguageModelConfig, "runs/language_model")
    config, args = parse_config(parser, LanguageModelConfig, argv)
    from keras_trm.jobs.language_model import run

    quiet_cuda_probe()
    write_run_config(parser, args)
    command = ("python " if prog.endswith(".py") else "") + " ".join([prog, *argv])
    result = run(config, args.data_dir, args.workdir, args.export_dir,
                 args.results_dir, command=command.strip())
    xl, vanilla = result["transformer_xl"], result["vanilla"] or {}  # None: no baseline
    print(json.dumps({
        "transformer_xl_test": xl["test"],
        "vanilla_test_sliding_window": vanilla.get("test_sliding_window"),
        "vanilla_test_disjoint": vanilla.get("test_disjoint"),
        "parameters": [xl["parameters"], vanilla.get("parameters")],
        "job_minutes": result["job_minutes"], "export": result["export"],
    }, indent=1))
    return 0


# --- the SavedModel of a run trained without TensorFlow ---------------------------


def _export_command(job, module, default_workdir):
    """``keras-trm export-<job>``: ``<module>.export_main(workdir)``."""
    def main(argv, prog=f"keras-trm export-{job}"):
        parser = argparse.ArgumentParser(
            prog=prog, description=f"Write the SavedModel of a `keras-trm train-{job}` "
            "run that trained where TensorFlow is not installed (it wrote "
            "<workdir>/export_request.json and printed this command). Needs "
            "TensorFlow; runs under KERAS_BACKEND=tensorflow.")
        parser.add_argument("--workdir", default=default_workdir,
                            help=f"the run's work folder (default {default_workdir})")
        args = parser.parse_args(argv)
        if not (pathlib.Path(args.workdir) / "export_request.json").is_file():
            parser.error(f"--workdir {args.workdir}: no export_request.json in it "
                         f"(a train-{job} run under JAX or PyTorch writes it)")
        if "keras" not in sys.modules:
            os.environ["KERAS_BACKEND"] = "tensorflow"
        quiet_cuda_probe()
        importlib.import_module(module).export_main(args.workdir)
        return 0

    main.__doc__ = f"Export a train-{job} run trained without TensorFlow (SavedModel)."
    return main


export_translation_main = _export_command(
    "translation", "keras_trm.jobs.translation", "runs/multi30k")
export_lm_main = _export_command(
    "lm", "keras_trm.jobs.language_model", "runs/language_model")


# --- text from an exported language model ------------------------------------------


def sample_lm_main(argv, prog="keras-trm sample-lm"):
    """Sample text from an exported Transformer-XL language model."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Continue --prompt with text sampled from a "
        "Transformer-XL LM that train-lm exported, the model's memories carried "
        "from segment to segment; prints the prompt followed by the sample.")
    parser.add_argument("export", metavar="EXPORT_VERSION_DIR",
                        help="SavedModel folder export/<name>/<version>")
    parser.add_argument("--prompt", required=True,
                        help="text to continue (characters, or words for a "
                        "word-level model; a newline is <eos>)")
    parser.add_argument("--num_tokens", type=number(int, 1), default=200,
                        help="tokens to generate (default 200)")
    parser.add_argument("--temperature", type=number(float, 0.0), default=1.0,
                        help="divides the log-probabilities; 0 takes the most "
                        "likely token (default 1)")
    parser.add_argument("--top_k", type=number(int, 0), default=0,
                        help="sample among the k most likely tokens (default 0: all)")
    parser.add_argument("--seed", type=number(int, 0), default=0,
                        help="random seed; the same seed gives the same text (default 0)")
    args = parser.parse_args(argv)
    problem = saved_model_problem(args.export, flag="EXPORT_VERSION_DIR")
    assets = pathlib.Path(args.export) / "assets.extra"
    if not problem and not all((assets / name).is_file()
                               for name in ("vocab.json", "config.json")):
        problem = (f"EXPORT_VERSION_DIR {args.export!r} has no assets.extra/"
                   "vocab.json and config.json: not a language model that "
                   "train-lm exported")
    if problem:
        parser.exit(2, f"{parser.prog}: error: {problem}\n")
    quiet_cuda_probe()
    from keras_trm.export.language_model import sample_text

    try:
        text, _ = sample_text(args.export, args.prompt, args.num_tokens,
                              args.temperature, args.top_k, args.seed)
    except ValueError as err:  # a prompt without tokens, or an unknown token
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print(args.prompt + text)
    return 0


COMMANDS = {
    "train-translation": train_translation_main,
    "train-imdb": train_imdb_main,
    "train-mnist": train_mnist_main,
    "train-lm": train_lm_main,
    "translate": translate_main,
    "serve": serve_main,
    "export-translation": export_translation_main,
    "export-lm": export_lm_main,
    "sample-lm": sample_lm_main,
}
# Replaced command -> what replaced it: the three-command split for machines
# without TensorFlow, before issue #61 (train-translation runs on every backend).
REPLACED = {
    "prepare-translation": "`keras-trm train-translation`, which prepares the "
    "token ids once in <workdir>/prepared (numpy, any backend)",
    "train-portable": "`KERAS_BACKEND=jax keras-trm train-translation` (or "
    "torch), which trains without TensorFlow",
    "export-portable": "`keras-trm export-translation --workdir DIR`, the "
    "command a run without TensorFlow prints",
}


def usage():
    """``keras-trm --help``: the subcommands, one line each (the first line
    of each function's docstring)."""
    width = max(map(len, COMMANDS))
    lines = [f"usage: keras-trm {{{','.join(COMMANDS)}}} [--help] ...", "",
             "The original Transformer family for Keras 3: train, translate, "
             "serve.", "", "commands:"]
    lines += [f"  {name:<{width}}  {function.__doc__.strip().splitlines()[0]}"
              for name, function in COMMANDS.items()]
    lines += ["", "keras-trm <command> --help lists the command's flags."]
    return "\n".join(lines)


def run_recipe(command_main, **kwargs):
    """A recipe script's ``__main__`` (``recipes/*.py``): the process set up
    as ``keras-trm``'s (``quiet_tensorflow_start``, ``tune_allocator``),
    then ``command_main(sys.argv[1:], **kwargs)``; returns its exit status.
    Call it before anything imports TensorFlow."""
    quiet_tensorflow_start()
    tune_allocator()
    return command_main(sys.argv[1:], **kwargs) or 0


def main(argv=None):
    if argv is None:
        # The command's own process, before anything imports TensorFlow:
        # no TensorFlow C++ log lines, and glibc malloc settings for training.
        quiet_tensorflow_start()
        if sys.argv[1:2] and sys.argv[1].startswith("train"):
            tune_allocator()
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv and argv[0] in REPLACED:
        print(f"keras-trm {argv[0]} was folded into {REPLACED[argv[0]]}", file=sys.stderr)
        return 2
    if not argv or argv[0] not in COMMANDS:
        print(usage(), file=sys.stderr)
        if argv:
            print(f"\nkeras-trm: error: unknown command {argv[0]!r}",
                  file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]](argv[1:]) or 0
    except Exception as err:  # noqa: BLE001 - only a full disk is handled
        from keras_trm.utils.files import is_no_space_error

        if not is_no_space_error(err):
            raise
        # The user's to fix, not a bug: one line, no traceback. Every write
        # is atomic, so the last checkpoint stays usable.
        print(f"keras-trm {argv[0]}: error: {err}\nNothing half-written was "
              "kept; free some space and run the same command again (training "
              "resumes from the work directory's last backup).", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
