"""Distribution strategy and XLA choices.

- ``"default"``: one device (``tf.distribute.get_strategy()``).
- ``"mirrored"``: ``tf.distribute.MirroredStrategy`` over the local GPUs, or
  over ``num_cpu_devices`` logical CPU devices when there is no GPU (this is
  how the tests exercise it on a 2-core machine).
- ``"multi_worker"``: ``tf.distribute.MultiWorkerMirroredStrategy``, the
  cluster taken from ``TF_CONFIG``.

XLA: Keras' ``jit_compile=True`` under ``MirroredStrategy`` over *logical CPU
devices* fails ("Trying to access resource ... located in device CPU:1 from
device CPU:0"): XLA's CPU client sees one device and cannot place the
replica's variables. ``resolve_jit_compile("auto", strategy)`` therefore turns
XLA off when a strategy has several replicas on CPUs and on otherwise (one
device, or GPUs).

Multi-worker data: every worker builds the same seeded stream of
token-count batches and keeps every ``num_workers``-th one
(``shard_batches``: tf.data's ``AutoShardPolicy.DATA``), so one global step
trains on ``num_workers`` consecutive batches of the stream, one per worker,
and the gradients are averaged over workers (each worker's loss is its mean
over its own real tokens). Only the chief (``task.type == "chief"``, or
worker 0 when there is no chief) writes checkpoints, logs and exports.
"""

import json
import os

import tensorflow as tf


def make_strategy(kind="default", num_cpu_devices=2):
    """Returns a ``tf.distribute.Strategy``.

    Must be called before TensorFlow initializes its devices when it creates
    logical CPU devices.

    Raises:
        ValueError: unknown ``kind``; logical devices requested after the
            runtime was initialized.
    """
    if kind == "default":
        return tf.distribute.get_strategy()
    if kind == "mirrored":
        if tf.config.list_physical_devices("GPU"):
            return tf.distribute.MirroredStrategy()
        split_cpu(num_cpu_devices)
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices[:num_cpu_devices])
    if kind == "multi_worker":
        cluster_spec = tf_config()
        if cluster_spec is None:
            raise ValueError(
                "strategy 'multi_worker' needs the cluster in the TF_CONFIG "
                "environment variable, which is not set")
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ValueError(
        "`kind` must be 'default', 'mirrored' or 'multi_worker', got "
        f"kind={kind!r}"
    )


def split_cpu(num_devices):
    """Splits the physical CPU into ``num_devices`` logical devices."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    existing = tf.config.get_logical_device_configuration(cpu)
    if existing and len(existing) >= num_devices:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices
        )
    except RuntimeError as e:
        raise ValueError(
            f"cannot create num_cpu_devices={num_devices} logical CPU devices "
            "after TensorFlow initialized its devices; call make_strategy() "
            "first"
        ) from e


def resolve_jit_compile(jit_compile, strategy):
    """``"auto"`` -> False for multi-replica CPU strategies, else True."""
    if jit_compile != "auto":
        return bool(jit_compile)
    if strategy.num_replicas_in_sync > 1 and not tf.config.list_physical_devices(
        "GPU"
    ):
        return False
    return True


def tf_config(value=None):
    """Parses and checks ``TF_CONFIG`` (the environment variable, or
    ``value``): ``{"cluster": {"worker": ["host:port", ...], "chief": [...]},
    "task": {"type": "worker", "index": 0}}`` (TensorFlow's multi-worker
    format, https://www.tensorflow.org/guide/distributed_training).

    Returns:
        the parsed dict, or None when TF_CONFIG is unset or empty.

    Raises:
        ValueError: naming TF_CONFIG and the bad part: not JSON, no
            ``cluster``, a job that is not a non-empty list of
            ``"host:port"``, no ``task``, a task type not in the cluster, an
            index out of range.

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
    if not raw or not raw.strip():
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


def shard_batches(dataset):
    """Sets tf.data's auto-shard policy to ``DATA`` on an already batched
    dataset: under ``MultiWorkerMirroredStrategy`` each worker then keeps
    every ``num_workers``-th batch (by batch index) of the same stream.
    (``FILE`` sharding cannot split a Python-generator dataset.)

    Example:
        >>> ds = shard_batches(tf.data.Dataset.range(4).batch(2))
        >>> ds.options().experimental_distribute.auto_shard_policy.name
        'DATA'
    """
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA)
    return dataset.with_options(options)
