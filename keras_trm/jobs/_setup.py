"""The start every job shares: resolve the data folder, create the work
folder, pick the progress-bar style."""

import collections
import pathlib
import sys
import time

from keras_trm.data import resolve_data_dir

JobStart = collections.namedtuple(
    "JobStart", ["start_time", "workdir", "data_dir", "verbose"])


def start_job(workdir, data_dir=None, verbose=None, note="", download=False):
    """Returns ``JobStart(start_time, workdir, data_dir, verbose)``.

    ``workdir`` is created (``pathlib.Path``); ``data_dir`` goes through
    ``resolve_data_dir`` (``FileNotFoundError`` naming the folders tried if
    there is none, unless ``download``: then the download cache
    ``~/keras_trm_data`` is used); ``verbose`` None becomes 1 (progress bar) on a terminal
    and 2 (one line per epoch) otherwise. Prints the data folder (and
    ``note``).
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
    """``start_job`` for the IMDB and MNIST jobs: sets ``job_start``,
    ``workdir``, ``data_dir``, ``verbose``, ``export_dir`` and
    ``results_dir`` (None: ``<workdir>/results``) on ``job``."""
    job.job_start, job.workdir, job.data_dir, job.verbose = start_job(
        workdir, data_dir, verbose, download=download)
    job.results_dir = job.workdir / "results" if results_dir is None else results_dir
    job.export_dir = export_dir
