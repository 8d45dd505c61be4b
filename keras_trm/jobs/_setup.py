"""What the jobs share: their start (data folder, work folder, progress-bar
style), the SavedModel export of a JAX or PyTorch run, config checks."""

import collections
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time

from keras_trm.data import resolve_data_dir

JobStart = collections.namedtuple("JobStart", ["start_time", "workdir", "data_dir", "verbose"])


def start_job(workdir, data_dir=None, verbose=None, note="", download=False):
    """Returns ``JobStart(start_time, workdir, data_dir, verbose)``: the
    ``workdir`` created; ``data_dir`` from ``resolve_data_dir`` (with
    ``download``, the download cache where none is found); ``verbose``
    None is 1 (progress bar) on a terminal, else 2. Prints the data folder
    (and ``note``).
    """
    start_time = time.time()
    if verbose is None:
        verbose = 1 if sys.stdout.isatty() else 2
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir = resolve_data_dir(data_dir, must_exist=not download)
    print(f"data: {data_dir}{note}", flush=True)
    return JobStart(start_time, workdir, data_dir, verbose)


def start_classifier_job(job, workdir, data_dir, export_dir, results_dir,
                         verbose, download):
    """``start_job`` for the IMDB and MNIST jobs: sets its fields, ``export_dir``
    and ``results_dir`` (None: ``<workdir>/results``) on ``job``."""
    job.job_start, job.workdir, job.data_dir, job.verbose = start_job(
        workdir, data_dir, verbose, download=download)
    job.results_dir = job.workdir / "results" if results_dir is None else results_dir
    job.export_dir = export_dir


def export_in_tensorflow(command, timeout=3600):
    """Runs an export command that a job printed (``keras-trm
    export-translation --workdir DIR``, ``keras-trm export-lm ...``) in a
    child process under ``KERAS_BACKEND=tensorflow``.

    Returns:
        ``pathlib.Path`` of the version folder (the child's
        ``<workdir>/export_request.done.json`` names it).

    Raises:
        RuntimeError: the child failed (its last output lines in the message).
    """
    args = shlex.split(command)[1:]
    child = subprocess.run([sys.executable, "-m", "keras_trm.cli", *args],
                           env=dict(os.environ, KERAS_BACKEND="tensorflow"),
                           capture_output=True, text=True, timeout=timeout)
    if child.returncode != 0:
        tail = "\n".join((child.stderr or child.stdout).splitlines()[-15:])
        raise RuntimeError(
            f"the TensorFlow export process failed (exit {child.returncode}):\n{tail}")
    done = pathlib.Path(args[-1]) / "export_request.done.json"
    return pathlib.Path(json.loads(done.read_text())["path"])


def export_from_request(workdir, export):
    """The child side of ``export_in_tensorflow``: loads the model that
    ``<workdir>/export_request.json`` names, calls ``export(model,
    request)`` (-> the version folder), writes
    ``export_request.done.json`` and returns the folder.

    Raises:
        RuntimeError: the process's Keras backend is not TensorFlow.
    """
    import keras

    from keras_trm.utils import write_json

    if keras.backend.backend() != "tensorflow":
        raise RuntimeError("the export process needs KERAS_BACKEND=tensorflow, "
                           f"got {keras.backend.backend()!r}")
    workdir = pathlib.Path(workdir)
    request = json.loads((workdir / "export_request.json").read_text())
    path = export(keras.saving.load_model(workdir / request["model"]), request)
    write_json(workdir / "export_request.done.json", {"path": str(path)})
    print(f"exported SavedModel to {path}", flush=True)
    return path


# -- config checks the jobs' validate() share (each names the field) ---------


def check_fields(config, checks):
    """Runs ``check(name, value)`` on each field of ``config`` that
    ``checks`` (``{check: field names}``, e.g. ``{checks.rate:
    ("dropout_rate",)}``) names."""
    for check, names in checks.items():
        for name in names:
            check(name, getattr(config, name))


def check_choices(name, values, allowed, check=None):
    """Checks a non-empty tuple or list of settings (``norms``, ``models``):
    each one of ``allowed`` (or passing ``check(name, value)``). A str or
    int is refused (a str would be read letter by letter).

    Raises:
        TypeError: not a tuple or list.
        ValueError: empty, or an item not allowed.
    """
    if not isinstance(values, (tuple, list)):
        raise TypeError(f"`{name}` must be a tuple or list of settings "
                        f"(one item: ({values!r},)), got {name}={values!r}")
    if not values:
        raise ValueError(f"`{name}` must name at least one, got {name}={values!r}")
    for value in values:
        if check is not None:
            check(name, value)
        elif not isinstance(value, str) or value not in allowed:
            raise ValueError(f"`{name}` must hold items of {sorted(allowed)}, "
                             f"got {value!r} in {name}={values!r}")
    return tuple(values)


def check_folder_name(name, value, empty_ok=False):
    """Checks a folder name under an output folder (``model_name``): a
    plain, non-empty name (no path separator, not ``.`` or ``..``), so
    that the export stays inside ``export_dir``."""
    if not isinstance(value, str):
        raise TypeError(f"`{name}` must be a str, got {name}={value!r}")
    if value == "" and empty_ok:
        return value
    if value in ("", ".", "..") or value != value.strip() or any(c in value for c in "/\\\0"):
        raise ValueError(f"`{name}` must be a plain folder name (no path "
                         f"separator, not '.' or '..', not empty), got {name}={value!r}")
    return value
