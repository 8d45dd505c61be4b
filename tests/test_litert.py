"""LiteRT (TFLite) export: the .tflite graph gives the Keras model's outputs
with builtin kernels only (the LiteRT interpreter, no Flex delegate)."""

import numpy as np
import pytest

from keras_trm.export.litert import export_litert, litert_predict
from keras_trm.models import encoder_classifier, lenet_cnn, transformer

from conftest import random_ids


def test_lenet_layer_norm(tmp_path, rng):
    model = lenet_cnn(norm="layer")
    images = rng.integers(0, 256, (3, 28, 28)).astype("uint8")
    path = export_litert(model, tmp_path / "lenet.tflite")
    np.testing.assert_allclose(litert_predict(path, images),
                               model.predict(images, verbose=0), atol=1e-5)


def test_encoder_classifier_with_padding(tmp_path, rng):
    model = encoder_classifier(500, num_layers=1, d_model=16, num_heads=2,
                               d_ff=32, max_sequence_length=64)
    ids = random_ids(rng, (3, 24), 500, pad_from=[24, 10, 3])
    path = export_litert(model, tmp_path / "encoder.tflite")
    got = litert_predict(path, ids)
    np.testing.assert_allclose(got, model.predict(ids, verbose=0), atol=1e-5)
    # another batch size and length through the same file
    ids = random_ids(rng, (5, 40), 500, pad_from=[40, 1, 7, 20, 39])
    np.testing.assert_allclose(litert_predict(path, ids),
                               model.predict(ids, verbose=0), atol=1e-5)


def test_transformer_teacher_forced(tmp_path, rng):
    model = transformer(300, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                        max_sequence_length=32)
    inputs = {"encoder_tokens": random_ids(rng, (2, 9), 300, pad_from=[9, 4]),
              "decoder_tokens": random_ids(rng, (2, 7), 300, pad_from=[7, 5])}
    path = export_litert(model, tmp_path / "transformer.tflite")
    np.testing.assert_allclose(litert_predict(path, inputs),
                               model.predict(inputs, verbose=0), atol=1e-4)


def test_bad_arguments_and_no_partial_file(tmp_path):
    model = lenet_cnn()
    with pytest.raises(ValueError, match="tflite"):
        export_litert(model, tmp_path / "model.bin")
    (tmp_path / "taken.tflite").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="taken.tflite"):
        export_litert(model, tmp_path / "taken.tflite")
    with pytest.raises(Exception):
        export_litert(model, tmp_path / "bad.tflite", input_signature="nonsense")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.tflite"]


# ---------------------------------------------------------------------------
# The translator: encode / decode_step signatures and the host-side search
# ---------------------------------------------------------------------------

import keras  # noqa: E402

from keras_trm.decoding.search import (  # noqa: E402
    BeamSearch, GreedySearch, search_strategy)
from keras_trm.decoding.translator import Translator  # noqa: E402
from keras_trm.export.litert import (  # noqa: E402
    LiteRTTranslator,
    _LiteRTModel,
    export_translator_litert,
    litert_op_names,
    read_litert_metadata,
)
from keras_trm.text import END_ID, START_ID  # noqa: E402

SENTENCES = [
    "A man in an orange hat starring at something.",
    "Two young, White males are outside near many bushes.",
    "A little girl climbing into a wooden playhouse.",
    "People are fixing the roof of a house.",
    "A dog runs.",
]


@pytest.fixture(scope="module")
def tiny_translator(small_vocab, tmp_path_factory):
    """A random tiny model on the real Multi30k vocabulary, float32 and int8
    files. END's embedding row is scaled so that hypotheses end at varied
    lengths (END paths) while others run to the step limit (39 steps:
    min(T_src + 50, max_sequence_length - 1) for any T_src here)."""
    keras.utils.set_random_seed(7)
    model = transformer(len(small_vocab), num_layers=2, d_model=32,
                        num_heads=2, d_ff=64, max_sequence_length=40, dropout_rate=0.0)
    embedding = model.get_layer("embedding").embeddings
    weights = embedding.numpy()
    weights[END_ID] *= 32.0
    embedding.assign(weights)
    folder = tmp_path_factory.mktemp("litert_translator")
    float32 = export_translator_litert(model, folder / "float32.tflite",
                                       small_vocab)
    int8 = export_translator_litert(model, folder / "int8.tflite", small_vocab,
                                    quantize="dynamic_int8")
    return model, float32, int8


def _reference(model, ids, beam_size):
    """keras_trm's search over the batch (the step limit is 39 for every
    sentence, so batched and one-by-one decoding agree)."""
    import tensorflow as tf

    if beam_size == 1:
        search = tf.function(lambda x: GreedySearch()(model, x))
    else:
        search = tf.function(lambda x: BeamSearch(beam_size=beam_size,
                                                  length_penalty=0.6)(model, x))
    out = []
    for best in search(tf.constant(ids)).numpy().tolist():
        out.append(best[:best.index(END_ID)] if END_ID in best
                   else [t for t in best if t])
    return out


@pytest.mark.parametrize("beam_size", [1, 2, 4])
def test_translator_tokens_equal_keras_search(tiny_translator, beam_size):
    model, path, _ = tiny_translator
    runner = LiteRTTranslator(path, search=search_strategy(beam_size=beam_size))
    ids = runner.encode_texts(SENTENCES)
    got = runner.translate_ids(ids)
    expected = _reference(model, ids, beam_size)
    assert got == expected
    # END paths and step-limit paths both occur
    lengths = [len(g) for g in got]
    assert any(n < 39 for n in lengths), lengths
    assert ids.shape[1] + 50 > 39


def test_translate_texts_equals_tf_translator(tiny_translator, tokenizer):
    model, path, _ = tiny_translator
    runner = LiteRTTranslator(path, search=BeamSearch(beam_size=4, length_penalty=0.6))
    reference = Translator(model, tokenizer, search=BeamSearch(beam_size=4, length_penalty=0.6))
    sentences = SENTENCES[:3] + ["   "]
    expected = reference.translate_texts(sentences)
    assert runner.translate_texts(sentences) == expected
    assert expected[-1] == "" and all(expected[:3])
    # The same with CTranslate2's early exit: one search rule everywhere.
    runner = LiteRTTranslator(path, search=BeamSearch(beam_size=4,
                                                      length_penalty=0.6, early_stopping="first_end"))
    reference = Translator(model, tokenizer, search=BeamSearch(beam_size=4, length_penalty=0.6, early_stopping="first_end"))
    assert runner.translate_texts(sentences) == reference.translate_texts(sentences)


def test_translator_file_is_builtin_only_with_metadata(tiny_translator,
                                                       small_vocab):
    _, path, _ = tiny_translator
    ops = litert_op_names(path)
    assert "FULLY_CONNECTED" in ops and "CONCATENATION" in ops
    assert not [op for op in ops if op.startswith("Flex") or op == "CUSTOM"
                or op in ("VAR_HANDLE", "READ_VARIABLE")], ops
    runner = LiteRTTranslator(path, search=GreedySearch())
    assert runner.signatures["encode"]["inputs"] == ["source_ids"]
    assert set(runner.signatures["decode_step"]["outputs"]) == {
        "logits", "self_keys_0", "self_values_0", "self_keys_1",
        "self_values_1"}
    # Dynamic shapes: rows, source and cache lengths are -1 in the file.
    details = runner._decode.get_input_details()
    assert list(details["self_keys_0"]["shape_signature"]) == [-1, 2, -1, 16]
    assert list(details["source_mask"]["shape_signature"]) == [-1, -1]
    metadata = read_litert_metadata(path)
    assert runner.vocabulary == small_vocab
    assert b'"format": 2' in metadata["keras_trm_translator_config"]


def test_translator_step_is_the_models_decode_step(tiny_translator, rng):
    """The file's signatures compute ``Transformer.cross_attention_caches``
    and ``Transformer.decode_step`` (same logits and caches) at any number
    of rows, source length and cache length."""
    import tensorflow as tf

    model, path, _ = tiny_translator
    lite = _LiteRTModel(LiteRTTranslator(path, search=GreedySearch()))
    for rows, width in ((1, 3), (5, 7)):
        source = random_ids(rng, (rows, width), 50, pad_from=[width] * rows)
        source[:, -1] = END_ID
        mask = tf.not_equal(source, 0)
        cross = model.cross_attention_caches(model.encode(source))
        lite_cross = lite.cross_attention_caches(tf.constant(source))
        caches = model.empty_caches(rows, 0, "float32")
        lite_caches = lite.empty_caches(rows, 0, "float32")
        for t in range(4):
            tokens = random_ids(rng, (rows, 1), 50)
            logits, caches = model.decode_step(tokens, t, caches, cross, mask,
                                               grow=True)
            lite_logits, lite_caches = lite.decode_step(
                tokens, t, lite_caches, lite_cross, mask)
            np.testing.assert_allclose(lite_logits, logits, atol=1e-4)
            for (k, v), (lk, lv) in zip(caches, lite_caches):
                assert lk.shape == k.shape == (rows, 2, t + 1, 16)
                np.testing.assert_allclose(lk, k, atol=1e-5)
                np.testing.assert_allclose(lv, v, atol=1e-5)


def test_int8_is_smaller_and_close(tiny_translator):
    _, float32, int8 = tiny_translator
    assert int8.stat().st_size < 0.6 * float32.stat().st_size
    from ai_edge_litert.interpreter import Interpreter

    weights = [t for t in Interpreter(str(int8)).get_tensor_details()
               if t["dtype"] == np.int8]
    assert weights, "no int8 weight tensors"
    # Same first-step logits up to quantization error.
    logits = []
    for path in (float32, int8):
        runner = LiteRTTranslator(path, search=GreedySearch())
        source = np.array([[5, 6, END_ID], [7, 8, END_ID], [9, 10, END_ID],
                           [11, END_ID, 0]], np.int32)
        model = _LiteRTModel(runner)  # the interface the searches use
        cross = model.cross_attention_caches(source)
        caches = model.empty_caches(4, 0, None)
        logits.append(model.decode_step(
            np.full((4, 1), 2), 0, caches, cross, source != 0)[0].numpy())
    # Loose: END's embedding row, scaled 32x, coarsens the int8 scale of the
    # tied embedding (the bench measures int8 on the trained model).
    correlation = np.corrcoef(logits[0].ravel(), logits[1].ravel())[0, 1]
    assert correlation > 0.9, correlation
    assert not np.array_equal(logits[0], logits[1])
    text = LiteRTTranslator(int8,
                            search=BeamSearch(beam_size=2)).translate_texts(SENTENCES[:2])
    assert all(isinstance(t, str) and t for t in text)


def test_translator_bad_arguments(tiny_translator, small_vocab, tmp_path):
    model, path, _ = tiny_translator
    for kwargs, name in [({"quantize": "int4"}, "quantize"),
                         ({"max_source_length": 41}, "max_source_length")]:
        with pytest.raises(ValueError, match=name):
            export_translator_litert(model, tmp_path / "x.tflite", small_vocab,
                                     **kwargs)
    with pytest.raises(ValueError, match="tflite"):
        export_translator_litert(model, tmp_path / "x.bin", small_vocab)
    with pytest.raises(ValueError, match="vocabulary"):
        export_translator_litert(model, tmp_path / "x.tflite", small_vocab[:-1])
    (tmp_path / "taken.tflite").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="taken.tflite"):
        export_translator_litert(model, tmp_path / "taken.tflite", small_vocab)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.tflite"]
    with pytest.raises(ValueError, match="batch_size"):
        LiteRTTranslator(path, batch_size=0)
    with pytest.raises(ValueError, match="num_threads"):
        LiteRTTranslator(path, num_threads=0)
    with pytest.raises(TypeError, match="search='beam'"):
        LiteRTTranslator(path, search="beam")
    with pytest.raises(ValueError, match="max_decoding_length"):
        LiteRTTranslator(path, search=GreedySearch(max_decoding_length=1000))
    with pytest.raises(FileNotFoundError):
        LiteRTTranslator(tmp_path / "missing.tflite")


def test_mixed_precision_model_exports_its_float32_weights(tiny_translator,
                                                           small_vocab,
                                                           tmp_path):
    """A model trained under mixed_bfloat16 (bf16 ops are not LiteRT
    builtins) is exported from a float32 copy of its weights: the file
    gives the float32 model's ids."""
    model, float32, _ = tiny_translator
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        mixed = transformer(len(small_vocab), num_layers=2, d_model=32,
                            num_heads=2, d_ff=64, max_sequence_length=40,
                            dropout_rate=0.0)
    finally:
        keras.config.set_dtype_policy("float32")
    mixed.set_weights(model.get_weights())
    path = export_translator_litert(mixed, tmp_path / "mixed.tflite",
                                    small_vocab)
    ids = LiteRTTranslator(float32, search=GreedySearch()).encode_texts(SENTENCES)
    assert (LiteRTTranslator(path, search=BeamSearch(beam_size=2)).translate_ids(ids)
            == LiteRTTranslator(float32,
                                search=BeamSearch(beam_size=2)).translate_ids(ids))


def test_files_written_before_the_rename_still_load(tiny_translator,
                                                   tmp_path):
    """Issue #41: a translator file whose config names the model's
    positions ``max_length`` (before ``max_sequence_length``) loads and
    translates as the new file; ``runner.max_length`` still reads, with a
    DeprecationWarning. The special ids are the file vocabulary's."""
    import json

    from keras_trm.export.litert import _add_metadata

    _, float32, _ = tiny_translator
    new = LiteRTTranslator(float32, search=GreedySearch())
    config = json.loads(read_litert_metadata(float32)[
        "keras_trm_translator_config"])
    config["max_length"] = config.pop("max_sequence_length")
    old_path = tmp_path / "old.tflite"
    old_path.write_bytes(_add_metadata(float32.read_bytes(), {
        "keras_trm_translator_config": json.dumps(config).encode()}))
    old = LiteRTTranslator(old_path, search=GreedySearch())
    assert old.max_sequence_length == new.max_sequence_length == 40
    with pytest.deprecated_call(match="max_sequence_length"):
        assert old.max_length == 40
    assert (old.start_id, old.end_id, old.pad_id) == (START_ID, END_ID, 0)
    ids = new.encode_texts(SENTENCES)
    assert old.translate_ids(ids) == new.translate_ids(ids)


def test_fixed_shape_files_of_older_versions_are_refused(tiny_translator,
                                                         tmp_path):
    import json

    from keras_trm.export.litert import _add_metadata

    _, float32, _ = tiny_translator
    old_config = {"batch_size": 4, "max_source_length": 40, "max_length": 40,
                  "num_layers": 2, "vocabulary_size": 100, "quantize": None}
    old = tmp_path / "old.tflite"
    old.write_bytes(_add_metadata(float32.read_bytes(), {
        "keras_trm_translator_config": json.dumps(old_config).encode()}))
    with pytest.raises(ValueError, match="export it again"):
        LiteRTTranslator(old)
