"""Distribution strategy and XLA choices (TensorFlow).

Strategies: ``"default"`` (one device), ``"mirrored"`` (the local GPUs, or
``num_cpu_devices`` logical CPU devices without one: how the tests run it
on 2 cores), ``"multi_worker"`` (the cluster of ``TF_CONFIG``).

XLA under ``MirroredStrategy`` over logical CPU devices fails ("Trying to
access resource ... located in device CPU:1 from device CPU:0": XLA's CPU
client sees one device), so ``resolve_jit_compile("auto")`` turns it off
there and on otherwise.

Multi-worker data: every worker builds the same seeded stream and keeps
every ``num_workers``-th batch (``shard_batches``), so one global step
trains on ``num_workers`` consecutive batches; with the loss's global
token count (``LabelSmoothedCrossEntropy``) the update is that of one
device on the global batch. Only the chief (``"chief"``, or worker 0
without one) writes checkpoints, logs and exports.
"""

import json
import os

import tensorflow as tf

from keras_trm.utils import checks as v


def make_strategy(kind="default", num_cpu_devices=2):
    """Returns a ``tf.distribute.Strategy``; call it before TensorFlow
    initializes its devices (it may create logical CPU devices).

    Args:
        kind: ``"default"``, ``"mirrored"`` or ``"multi_worker"``.
        num_cpu_devices: int >= 1, the logical CPU devices of
            ``"mirrored"`` when there is no GPU.

    Raises:
        TypeError: ``num_cpu_devices`` not an int (with ``"mirrored"``).
        ValueError: unknown ``kind``; ``num_cpu_devices`` < 1 (with
            ``"mirrored"``, checked before TensorFlow is touched); logical
            devices requested after the runtime was initialized.
    """
    if kind == "default":
        return tf.distribute.get_strategy()
    if kind == "mirrored":
        num_cpu_devices = v.positive_int("num_cpu_devices", num_cpu_devices)
        if tf.config.list_physical_devices("GPU"):
            return tf.distribute.MirroredStrategy()
        split_cpu(num_cpu_devices)
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices[:num_cpu_devices])
    if kind == "multi_worker":
        if tf_config() is None:
            raise ValueError(
                "strategy 'multi_worker' needs the cluster in the TF_CONFIG "
                "environment variable, which is not set")
        _patch_keras_multi_worker_logs()
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ValueError("`kind` must be 'default', 'mirrored' or 'multi_worker', "
                     f"got kind={kind!r}")


def split_cpu(num_devices):
    """Splits the physical CPU into ``num_devices`` logical devices.

    Raises:
        TypeError / ValueError: ``num_devices`` not an int >= 1.
        ValueError: TensorFlow initialized its devices already.
    """
    num_devices = v.positive_int("num_devices", num_devices)
    cpu = tf.config.list_physical_devices("CPU")[0]
    existing = tf.config.get_logical_device_configuration(cpu)
    if existing and len(existing) >= num_devices:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError as e:
        raise ValueError(
            f"cannot create num_cpu_devices={num_devices} logical CPU devices "
            "after TensorFlow initialized its devices; call make_strategy() "
            "first") from e


def resolve_jit_compile(jit_compile, strategy=None):
    """Keras' ``jit_compile`` for ``compile``: True / ``"on"`` -> True,
    False / ``"off"`` -> False, ``"auto"`` -> False for a multi-replica
    strategy on CPUs, else True.

    Args:
        jit_compile: True, False, ``"on"``, ``"off"`` or ``"auto"``.
        strategy: the ``tf.distribute.Strategy`` of the model (None: the
            current one).

    Raises:
        ValueError: any other ``jit_compile`` (e.g. ``"false"``, which
            ``bool`` would turn on).

    Example:
        >>> resolve_jit_compile("off"), resolve_jit_compile("auto")
        (False, True)
    """
    if isinstance(jit_compile, bool):
        return jit_compile
    if not isinstance(jit_compile, str) or jit_compile not in ("on", "off", "auto"):
        raise ValueError(
            "`jit_compile` must be True, False, 'on', 'off' or 'auto', got "
            f"jit_compile={jit_compile!r}")
    if jit_compile != "auto":
        return jit_compile == "on"
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    return (strategy.num_replicas_in_sync == 1
            or bool(tf.config.list_physical_devices("GPU")))


def tf_config(value=None):
    """Parses and checks ``TF_CONFIG`` (the environment variable, or
    ``value``): ``{"cluster": {"worker": ["host:port", ...], "chief": [...]},
    "task": {"type": "worker", "index": 0}}``, TensorFlow's multi-worker
    format; None when it is unset or empty.

    Raises:
        ValueError: naming TF_CONFIG and the bad part: not JSON, no
            ``cluster``, a job not a non-empty list of ``"host:port"``, no
            ``task``, a task type not in the cluster, an index out of range.

    Example:
        >>> cfg = tf_config('{"cluster": {"worker": ["127.0.0.1:2222"]}, '
        ...                 '"task": {"type": "worker", "index": 0}}')
        >>> cfg["task"]["index"]
        0
        >>> tf_config('{"task": {}}')
        Traceback (most recent call last):
        ...
        ValueError: TF_CONFIG has no "cluster": '{"task": {}}'
    """
    raw = os.environ.get("TF_CONFIG", "") if value is None else value
    if not (raw or "").strip():
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e}): {raw!r}") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict) \
            or not config["cluster"]:
        raise ValueError(f'TF_CONFIG has no "cluster": {raw!r}')
    for job, addresses in config["cluster"].items():
        if not isinstance(addresses, list) or not addresses or not all(
                isinstance(a, str) and a.rpartition(":")[2].isdigit()
                for a in addresses):
            raise ValueError(
                f'TF_CONFIG cluster job {job!r} must be a non-empty list of '
                f'"host:port" strings, got {addresses!r}')
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ValueError(
            f'TF_CONFIG needs "task": {{"type": ..., "index": ...}}, got '
            f'task={task!r}')
    if task["type"] not in config["cluster"]:
        raise ValueError(
            f"TF_CONFIG task type {task['type']!r} is not a job of the "
            f"cluster {sorted(config['cluster'])}")
    n = len(config["cluster"][task["type"]])
    if not isinstance(task["index"], int) or not 0 <= task["index"] < n:
        raise ValueError(
            f"TF_CONFIG task index {task['index']!r} is out of range for "
            f"job {task['type']!r} of {n} task(s)")
    return config


def worker_info(strategy=None):
    """``(num_workers, worker_index, is_chief)`` of this process: (1, 0,
    True) outside a multi-worker strategy.

    Example:
        >>> worker_info()
        (1, 0, True)
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return 1, 0, True
    spec = resolver.cluster_spec().as_dict()
    num = sum(len(v) for k, v in spec.items() if k in ("chief", "worker"))
    kind, index = resolver.task_type, resolver.task_id
    chief = kind == "chief" or (kind == "worker" and index == 0
                                and "chief" not in spec)
    position = index + (len(spec.get("chief", [])) if kind == "worker" else 0)
    return num, position, chief


def shard_batches(dataset, strategy=None):
    """Shards a batched dataset by batch index for
    ``MultiWorkerMirroredStrategy``: worker i of n keeps batches i, i + n,
    ..., whole. With a multi-worker ``strategy`` this returns
    ``strategy.distribute_datasets_from_function(...)`` (``fit`` takes it
    as is); otherwise ``dataset`` with tf.data's auto-shard policy ``DATA``
    (FILE sharding cannot split a Python-generator dataset).

    Raises:
        TypeError: ``dataset`` not a ``tf.data.Dataset``.

    Example:
        >>> ds = shard_batches(tf.data.Dataset.range(4).batch(2))
        >>> ds.options().experimental_distribute.auto_shard_policy.name
        'DATA'
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError("`dataset` must be a batched tf.data.Dataset, got "
                        f"dataset={dataset!r}")
    if strategy is not None and worker_info(strategy)[0] > 1:
        def per_worker(context):
            return dataset.shard(context.num_input_pipelines,
                                 context.input_pipeline_id)
        return strategy.distribute_datasets_from_function(per_worker)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA)
    return dataset.with_options(options)


def build_for_distributed_fit(model, strategy, dataset):
    """Works around Keras 3.15's ``_maybe_symbolic_build``, which fails on a
    distributed dataset of nested elements (``({"encoder_tokens": ...},
    labels)``: "Attempt to convert a value ... to a Tensor"): builds the
    compiled loss, metrics and optimizer once under ``strategy.scope()``
    from one batch of the undistributed ``dataset`` and makes that method a
    no-op for this model. Needed when ``fit`` gets a dataset from
    ``shard_batches(..., strategy)`` with several workers.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> m.compile("adam", "mse")
        >>> ds = tf.data.Dataset.from_tensors((np.ones((1, 2)), np.ones((1, 1))))
        >>> build_for_distributed_fit(m, tf.distribute.get_strategy(), ds)
        >>> m.optimizer.built
        True
    """
    batch = next(iter(dataset.take(1)))
    with strategy.scope():
        model._symbolic_build(data_batch=batch)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None


def _patch_keras_multi_worker_logs():
    """Keras 3.15 averages a step's logs over workers with
    ``strategy.reduce("MEAN", v, axis=0)``, which fails on scalar metric
    results ("Invalid reduction dimension 0"); under
    ``MultiWorkerMirroredStrategy`` this takes the mean over replicas only
    (``axis=None``)."""
    from keras.src.backend.tensorflow import trainer as tf_trainer
    from keras.src import tree

    original = tf_trainer.reduce_per_replica
    if getattr(original, "_keras_trm", False):
        return

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and \
                tf_trainer._collective_all_reduce_multi_worker(strategy):
            return tree.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    reduce_per_replica._keras_trm = True
    tf_trainer.reduce_per_replica = reduce_per_replica
