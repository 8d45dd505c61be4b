"""Benchmarks: each writes its figures to JSON under ``bench/results/``
(``docs/measurements.md`` says which command made which). Run them from the
repository root as ``python bench/<tool>.py``; tests import them as
``bench.<tool>`` (pytest puts the root on ``sys.path``).

- ``ab``: same-run A/B of two revisions (train step, searches, SavedModel,
  job memory); ``ab_child`` is its child process.
- ``common``: host, date, a revision's code as a tree, result files.
- ``gpu_train``, ``gpu_check``, ``gpu_attention_lengths``, ``step_parts``,
  ``gpu_session.sh``: the GPU measurements.
- ``bench_data_pipeline``, ``bench_job_memory``: the input pipeline's and the
  translation job's memory and speed.
"""
