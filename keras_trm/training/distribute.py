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
"""

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
