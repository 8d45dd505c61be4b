"""LiteRT (TFLite) export of keras_trm models, written atomically.

The conversion is Keras' own (``model.export(path, format="litert")``, the
TensorFlow Lite converter underneath); this module adds the atomic write,
the argument checks and a runner for the ``.tflite`` file that uses the
LiteRT interpreter (``ai_edge_litert``), or ``tf.lite.Interpreter`` where
that package is missing.

LiteRT graphs take fixed-rank tensors of numbers: export models whose inputs
are token ids or images (the classifiers, the LeNet CNN, the Transformer's
teacher-forced forward pass). Raw-string signatures with in-graph
tokenization belong in the SavedModel exports.
"""

import pathlib

import numpy as np

from keras_trm.utils.files import atomic_file


def export_litert(model, path, input_signature=None, **converter_kwargs):
    """Writes ``model`` as a LiteRT flatbuffer at ``path`` (``.tflite``).

    Args:
        model: a built ``keras.Model``.
        path: target file; must end in ``.tflite``. Its folder is created.
        input_signature: optional ``keras.InputSpec`` / ``tf.TensorSpec``
            structure (default: the model's inputs, batch dimension dynamic).
        **converter_kwargs: passed to the TFLite converter
            (``optimizations``, ``enable_select_tf_ops``, ...).

    Returns:
        ``pathlib.Path`` of the written file.

    Raises:
        ValueError: ``path`` does not end in ``.tflite`` or the model is not
            built.
        FileExistsError: ``path`` exists (nothing is overwritten).
        Any converter error; then no file is left at ``path``.
    """
    path = pathlib.Path(path)
    if path.suffix != ".tflite":
        raise ValueError(f"`path` must end in .tflite, got {str(path)!r}")
    if not model.built:
        raise ValueError(f"`model` {model.name!r} must be built before export")
    if path.exists():
        raise FileExistsError(f"`path` {str(path)!r} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, suffix=".tflite") as tmp:
        tmp.unlink()  # the exporter refuses to overwrite in some versions
        model.export(str(tmp), format="litert", verbose=False,
                     input_signature=input_signature, **converter_kwargs)
    return path


def _interpreter(model_path):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:  # pragma: no cover - fallback, deprecated in TF
        import tensorflow as tf

        Interpreter = tf.lite.Interpreter
    return Interpreter(model_path=str(model_path))


def litert_predict(model_path, inputs, signature_key="serving_default"):
    """Runs a ``.tflite`` file's signature on NumPy inputs.

    Args:
        model_path: the ``.tflite`` file.
        inputs: an array (single-input models), or a dict input name ->
            array (names as in the Keras model's inputs, e.g.
            ``{"encoder_tokens": ..., "decoder_tokens": ...}``). Arrays are
            cast to the graph's dtypes; the batch dimension may vary.
        signature_key: the signature to run.

    Returns:
        The output array for single-output signatures, else a dict name ->
        array.

    Raises:
        ValueError: unknown signature, or input names that differ from the
            signature's.
    """
    interpreter = _interpreter(model_path)
    signatures = interpreter.get_signature_list()
    if signature_key not in signatures:
        raise ValueError(f"`signature_key` {signature_key!r} not in {sorted(signatures)}")
    runner = interpreter.get_signature_runner(signature_key)
    details = runner.get_input_details()
    if not isinstance(inputs, dict):
        if len(details) != 1:
            raise ValueError(f"{model_path} takes inputs {sorted(details)}: pass a dict")
        inputs = {next(iter(details)): inputs}
    if set(inputs) != set(details):
        raise ValueError(f"`inputs` names {sorted(inputs)} differ from the "
                         f"signature's {sorted(details)}")
    outputs = runner(**{k: np.asarray(v, details[k]["dtype"])
                        for k, v in inputs.items()})
    if len(outputs) == 1:
        (out,) = outputs.values()
        return out
    return outputs
