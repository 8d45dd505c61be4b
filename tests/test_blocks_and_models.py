"""Encoder/decoder blocks and the transformer() models."""

import keras
import numpy as np
import pytest

from conftest import random_ids
from keras_trm.layers import TransformerDecoderBlock, TransformerEncoderBlock
from keras_trm.models import (
    Transformer,
    as_transformer,
    transformer,
    transformer_base,
    transformer_big,
    transformer_small,
)


pytestmark = pytest.mark.portable  # CI runs it under each backend


def to_numpy(x, dtype=None):
    """A tensor of any backend (a PyTorch one that requires grad too) as
    a NumPy array."""
    return np.asarray(keras.ops.convert_to_numpy(x), dtype)


def expected_parameters(vocab, n, d, d_ff):
    """Closed-form parameter count of a tied, post-LN transformer()."""
    attention = 4 * d * d + 4 * d
    ffn = 2 * d * d_ff + d_ff + d
    norm = 2 * d
    encoder = attention + ffn + 2 * norm
    decoder = 2 * attention + ffn + 3 * norm
    return vocab * d + n * (encoder + decoder)


def test_preset_parameter_counts():
    base = transformer_base(37000)
    big = transformer_big(37000)
    assert base.count_params() == expected_parameters(37000, 6, 512, 2048)
    assert big.count_params() == expected_parameters(37000, 6, 1024, 4096)
    # Paper, Table 3: 65M and 213M (their vocabulary handling differs a bit).
    assert 62e6 < base.count_params() < 66e6
    assert 212e6 < big.count_params() < 216e6
    assert base.get_layer("encoder_layer_0").dropout_rate == 0.1
    assert big.get_layer("encoder_layer_0").dropout_rate == 0.3
    assert isinstance(base, Transformer) and len(base.encoder_layers) == 6


def test_three_way_tying_is_one_variable():
    model = transformer_small(500, num_layers=1, d_model=16, d_ff=32)
    tables = [w for w in model.weights if w.shape == (500, 16)]
    assert len(tables) == 1
    untied = transformer_small(500, num_layers=1, d_model=16, d_ff=32,
                               tie_embeddings="none")
    assert len([w for w in untied.weights if 500 in w.shape]) == 4  # 2 tables + W, b


def _tiny(**kwargs):
    config = dict(num_layers=2, d_model=16, num_heads=2, d_ff=32,
                  max_sequence_length=20, dropout_rate=0.1)
    config.update(kwargs)
    return transformer(50, **config)


def test_decoder_is_causal_and_padding_is_masked(rng):
    model = _tiny()
    src = random_ids(rng, (2, 7), 50, pad_from=[7, 4])
    tgt = random_ids(rng, (2, 6), 50)
    out = to_numpy(model({"encoder_tokens": src, "decoder_tokens": tgt}))
    tgt2 = tgt.copy()
    tgt2[:, 4:] = (tgt2[:, 4:] % 49) + 1  # change later target tokens
    out2 = to_numpy(model({"encoder_tokens": src, "decoder_tokens": tgt2}))
    np.testing.assert_allclose(out[:, :4], out2[:, :4], atol=1e-5)
    assert not np.allclose(out[:, 4:], out2[:, 4:])
    # Extra source padding changes nothing.
    src_padded = np.concatenate([src, np.zeros((2, 3), "int32")], 1)
    out3 = to_numpy(model({"encoder_tokens": src_padded, "decoder_tokens": tgt}))
    np.testing.assert_allclose(out, out3, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_stacked_decoder_blocks_read_keras_masks_at_every_layer(rng,
                                                                norm_first):
    """Decoder blocks stacked on tensors that carry Keras masks (no mask
    arguments) give, at the kept target rows, what explicit masks give,
    at the second layer too: each block's output carries its input's
    mask, and the encoder output keeps its mask after the first layer's
    cross-attention (Keras' attention deletes its inputs' masks; ours puts
    them back)."""
    blocks = [TransformerDecoderBlock(num_heads=2, d_ff=16,
                                      norm_first=norm_first)
              for _ in range(2)]
    target = rng.normal(size=(2, 5, 8)).astype("float32")
    source = rng.normal(size=(2, 6, 8)).astype("float32")
    target_mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    source_mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
    target[~target_mask] = 0.0
    source[~source_mask] = 0.0
    masking = keras.layers.Masking(0.0)
    y, encoder_outputs = masking(target), masking(source)
    for block in blocks:
        y = block(y, encoder_outputs)
        np.testing.assert_array_equal(
            to_numpy(getattr(y, "_keras_mask", None)), target_mask)
    np.testing.assert_array_equal(
        to_numpy(getattr(encoder_outputs, "_keras_mask", None)), source_mask)
    explicit = keras.ops.convert_to_tensor(target)
    for block in blocks:
        explicit = block(explicit, keras.ops.convert_to_tensor(source),
                         decoder_padding_mask=target_mask,
                         encoder_padding_mask=source_mask)
    np.testing.assert_allclose(to_numpy(y)[target_mask],
                               to_numpy(explicit)[target_mask], atol=1e-5)


def test_post_ln_output_is_normalized(rng):
    block = TransformerEncoderBlock(num_heads=2, d_ff=8)
    x = rng.normal(2.0, 3.0, size=(2, 5, 8)).astype("float32")
    y = to_numpy(block(x))
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.std(-1), 1.0, atol=1e-3)
    pre = TransformerEncoderBlock(num_heads=2, d_ff=8, norm_first=True)
    assert not np.allclose(to_numpy(pre(x)).std(-1), 1.0, atol=1e-2)


@pytest.mark.parametrize("norm_first, tie", [(False, "all"), (True, "decoder"),
                                             (False, "none")])
def test_model_round_trip(tmp_path, rng, norm_first, tie):
    model = _tiny(norm_first=norm_first, tie_embeddings=tie,
                  target_vocabulary_size=None if tie == "all" else 60)
    x = {"encoder_tokens": random_ids(rng, (2, 5), 50, pad_from=[5, 3]),
         "decoder_tokens": random_ids(rng, (2, 4), 50)}
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(to_numpy(model(x)), to_numpy(loaded(x)))


def test_blocks_round_trip(tmp_path, rng):
    src = keras.Input((None, 16))
    tgt = keras.Input((None, 16))
    enc = TransformerEncoderBlock(num_heads=4, d_ff=32, norm_first=True)(src)
    dec = TransformerDecoderBlock(num_heads=4, d_ff=32)(tgt, enc)
    model = keras.Model([src, tgt], dec)
    x = [rng.normal(size=(2, 5, 16)).astype("float32"),
         rng.normal(size=(2, 3, 16)).astype("float32")]
    model.save(tmp_path / "blocks.keras")
    loaded = keras.models.load_model(tmp_path / "blocks.keras")
    np.testing.assert_array_equal(to_numpy(model(x)), to_numpy(loaded(x)))


def test_incremental_decoding_equals_full_recompute(rng):
    for norm_first in (False, True):
        model = _tiny(norm_first=norm_first)
        src = random_ids(rng, (2, 7), 50, pad_from=[7, 5])
        tgt = random_ids(rng, (2, 6), 50)
        full = to_numpy(model({"encoder_tokens": src, "decoder_tokens": tgt}))
        enc = model.encode(src)
        cross = model.cross_attention_caches(enc)
        caches = model.empty_caches(2, 6, "float32")
        steps = []
        for t in range(6):
            logits, caches = model.decode_step(
                tgt[:, t:t + 1], t, caches, cross, src != 0)
            steps.append(to_numpy(logits))
        np.testing.assert_allclose(np.stack(steps, 1), full, atol=1e-4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=30, num_heads=4), "d_model.*divisible.*num_heads"),
    (dict(tie_embeddings="both"), "tie_embeddings"),
    (dict(target_vocabulary_size=70), "one shared vocabulary"),
    (dict(num_layers=0), "num_layers"),
])
def test_bad_model_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _tiny(**kwargs)


def test_as_transformer_rejects_foreign_models():
    inp = keras.Input((3,))
    with pytest.raises(ValueError, match="not built by"):
        as_transformer(keras.Model(inp, keras.layers.Dense(2)(inp)))


@pytest.mark.parametrize("kwargs", [
    dict(), dict(tie_embeddings="none", target_vocabulary_size=40),
    dict(tie_embeddings="decoder", target_vocabulary_size=40,
         norm_first=True, position="learned"),
])
def test_transformer_round_trips_and_converts_plain_functional_files(
        rng, tmp_path, kwargs):
    """A ``.keras`` file loads back as a ``Transformer`` with the same
    logits; a file of the same layers saved as a plain functional model (as
    ``transformer()`` wrote them before the class existed) converts with
    ``as_transformer`` to the same logits and configuration."""
    model = _tiny(**kwargs)
    x = {"encoder_tokens": random_ids(rng, (2, 5), 50, pad_from=[5, 3]),
         "decoder_tokens": random_ids(rng, (2, 4), 40)}
    expected = to_numpy(model(x))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert type(loaded) is Transformer
    assert loaded.get_config() == model.get_config()
    np.testing.assert_array_equal(to_numpy(loaded(x)), expected)

    keras.Model(model.inputs, model.outputs, name="old").save(
        tmp_path / "functional.keras")
    functional = keras.saving.load_model(tmp_path / "functional.keras")
    assert not isinstance(functional, Transformer)
    converted = as_transformer(functional)
    assert type(converted) is Transformer
    assert {**converted.get_config(), "name": model.name} == model.get_config()
    np.testing.assert_array_equal(to_numpy(converted(x)), expected)
    assert as_transformer(converted) is converted


def _saved_before_the_rename(path):
    """Rewrites a ``.keras`` file as keras_trm wrote it before issue #41:
    the position table's size named ``max_length`` in every config."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    text = files["config.json"].decode("utf-8")
    assert '"max_sequence_length"' in text
    files["config.json"] = text.replace('"max_sequence_length"',
                                        '"max_length"').encode("utf-8")
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def test_files_and_configs_saved_with_max_length_still_load(rng, tmp_path):
    """Issue #41: ``max_length`` (the position table) is now
    ``max_sequence_length``. ``.keras`` files and configs written before
    load silently (the old key is read as the new one): a Transformer, the
    same layers as a plain functional model, a classifier and a
    PositionalEmbedding config."""
    import warnings

    from keras_trm.layers import PositionalEmbedding
    from keras_trm.models import encoder_classifier

    model = _tiny(tie_embeddings="decoder", target_vocabulary_size=40)
    x = {"encoder_tokens": random_ids(rng, (2, 5), 50, pad_from=[5, 3]),
         "decoder_tokens": random_ids(rng, (2, 4), 40)}
    classifier = encoder_classifier(50, num_layers=1, d_model=16, num_heads=2,
                                    d_ff=32, max_sequence_length=12)
    ids = random_ids(rng, (2, 6), 50, pad_from=[6, 2])
    model.save(tmp_path / "model.keras")
    keras.Model(model.inputs, model.outputs, name="old").save(
        tmp_path / "functional.keras")
    classifier.save(tmp_path / "classifier.keras")
    config = PositionalEmbedding(50, 8, max_sequence_length=6).get_config()
    config["max_length"] = config.pop("max_sequence_length")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DeprecationWarning either
        loaded = keras.saving.load_model(
            _saved_before_the_rename(tmp_path / "model.keras"))
        functional = keras.saving.load_model(
            _saved_before_the_rename(tmp_path / "functional.keras"))
        old_classifier = keras.saving.load_model(
            _saved_before_the_rename(tmp_path / "classifier.keras"))
        layer = PositionalEmbedding.from_config(config)
        old_config = {**model.get_config(), "max_length": 20}
        del old_config["max_sequence_length"]
        rebuilt = Transformer.from_config(old_config)
    assert layer.max_sequence_length == 6
    assert type(loaded) is Transformer and loaded.max_sequence_length == 20
    assert loaded.get_config() == model.get_config()
    assert rebuilt.get_config() == model.get_config()
    np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))
    converted = as_transformer(functional)
    assert converted.max_sequence_length == 20
    np.testing.assert_array_equal(to_numpy(converted(x)), to_numpy(model(x)))
    assert old_classifier.get_layer("embedding").max_sequence_length == 12
    np.testing.assert_array_equal(to_numpy(old_classifier(ids)),
                                  to_numpy(classifier(ids)))


def test_the_old_max_length_keyword_and_attribute_still_work():
    """``max_length=`` of the builders and the layer, and ``.max_length`` of
    the model and the layer: the same as ``max_sequence_length``, with a
    DeprecationWarning naming the new name."""
    from keras_trm.layers import PositionalEmbedding
    from keras_trm.models import (encoder_classifier, text_classifier,
                                  vanilla_transformer_lm)

    message = "`max_length` is now `max_sequence_length`"
    with pytest.deprecated_call(match=message):
        model = _tiny(max_length=12, max_sequence_length=256)
    assert model.max_sequence_length == 12
    assert model.get_config()["max_sequence_length"] == 12
    assert "max_length" not in model.get_config()
    with pytest.deprecated_call(match=message):
        assert model.max_length == 12
    with pytest.deprecated_call(match=message):
        layer = PositionalEmbedding(10, 4, max_length=7)
    with pytest.deprecated_call(match=message):
        assert layer.max_length == 7
    assert "max_length" not in dir(layer)  # Keras' saving never reads it
    for build in (
            lambda **kw: encoder_classifier(50, num_layers=1, d_model=8,
                                            num_heads=2, d_ff=8, **kw),
            lambda **kw: text_classifier("encoder", 50, d_model=8,
                                         num_heads=2, d_ff=8, **kw),
            lambda **kw: vanilla_transformer_lm(50, num_layers=1, d_model=8,
                                                num_heads=2, d_ff=8, **kw)):
        with pytest.deprecated_call(match=message):
            built = build(max_length=9)
        assert built.get_layer("embedding").max_sequence_length == 9
    with pytest.raises(TypeError, match="max_sequence_length"):
        PositionalEmbedding(10, 4)
    with pytest.raises(ValueError, match="max_sequence_length=0"):
        PositionalEmbedding(10, 4, max_sequence_length=0)
    with pytest.raises(AttributeError, match="no_such_thing"):
        model.no_such_thing


# -- bad input: each refused with the argument named (on every backend) ----


def _tiny_transformer():
    return transformer(20, num_layers=2, d_model=8, num_heads=2, d_ff=16,
                       max_sequence_length=8, dropout_rate=0.0)


def test_bad_cache_positions_are_refused():
    """A host position outside the cache was clamped to the last position
    (TensorFlow, JAX) or its write dropped (PyTorch): a silently wrong
    output. Tensors stay unchecked (the searches' loop counters)."""
    from keras_trm.layers import MultiHeadAttention

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    mha = MultiHeadAttention(2, 4)
    mha(x, x)
    cache = (np.zeros((2, 2, 4, 4), "float32"),) * 2  # S = 4

    def step(length, index):
        return mha.call_with_cache(x[:, :length], cache,
                                   new_key_value=x[:, :length],
                                   cache_update_index=index)

    out, _ = step(1, 3)
    assert tuple(out.shape) == (2, 1, 8)
    for index in (4, 10, -1, 9):
        with pytest.raises(ValueError, match=r"cache_update_index.*\[0, 3\]"):
            step(1, index)
    with pytest.raises(ValueError, match=r"cache_update_index.*\[0, 2\]"):
        step(2, 3)
    for index in (1.5, True):
        with pytest.raises(TypeError, match="cache_update_index"):
            step(1, index)
    keys = mha.key_value_heads(x[:, :0])[0]
    assert tuple(keys.shape) == (2, 2, 0, 4)

    model = _tiny_transformer()
    src = np.array([[3, 4, 5, 0]], "int32")
    cross = model.cross_attention_caches(model.encode(src))
    caches = model.empty_caches(1, 4, "float32")
    tok = np.array([[2]], "int32")
    model.decode_step(tok, 3, caches, cross, src != 0)
    with pytest.raises(ValueError, match="cache_update_index"):
        model.decode_step(tok, 6, caches, cross, src != 0)
    with pytest.raises(ValueError, match="index=-1"):
        model.decode_step(tok, -1, model.empty_caches(1, 0, "float32"),
                          cross, src != 0, grow=True)


def test_decode_step_needs_one_cache_per_layer():
    """zip() stopped at the shorter list: with no caches every decoder
    layer was skipped and the logits were those of the embedding alone."""
    model = _tiny_transformer()
    src = np.array([[3, 4, 5, 0]], "int32")
    cross = model.cross_attention_caches(model.encode(src))
    empty = model.empty_caches(1, 0, "float32")
    tok = np.array([[2]], "int32")
    logits, caches = model.decode_step(tok, 0, empty, cross, src != 0, grow=True)
    assert len(caches) == 2
    with pytest.raises(ValueError, match="caches.*num_layers=2, got 0"):
        model.decode_step(tok, 0, [], cross, src != 0, grow=True)
    with pytest.raises(ValueError, match="cross_caches.*num_layers=2, got 1"):
        model.decode_step(tok, 0, empty, (cross[0][:1], cross[1]), src != 0,
                          grow=True)
    with pytest.raises(ValueError, match="index=1 and caches of 0 positions"):
        model.decode_step(tok, 1, empty, cross, src != 0, grow=True)


def test_positional_embedding_start_index_is_checked():
    from keras_trm.layers import PositionalEmbedding

    pe = PositionalEmbedding(10, 8, 6)
    ids = np.array([[1, 2, 3]], "int32")
    with pytest.raises(ValueError, match="start_index=-2"):
        pe(ids, start_index=-2)
    with pytest.raises(TypeError, match="start_index=1.5"):
        pe(ids, start_index=1.5)
    with pytest.raises(ValueError, match="max_sequence_length=6"):
        pe(ids, start_index=4)


def test_float_ids_are_refused_by_the_models():
    """A functional model casts float inputs to its int32 Inputs: 3.9
    became id 3 without a word."""
    from keras_trm.models import vanilla_transformer_lm

    model = _tiny_transformer()
    ids = np.array([[3, 4, 5, 0]], "int32")
    model({"encoder_tokens": ids, "decoder_tokens": ids[:, :3]})
    with pytest.raises(TypeError, match="encoder_tokens.*float32"):
        model({"encoder_tokens": ids.astype("float32") + 0.9,
               "decoder_tokens": ids[:, :3]})
    with pytest.raises(TypeError, match="decoder_tokens.*float64"):
        model({"encoder_tokens": ids, "decoder_tokens": ids[:, :3] + 0.5})
    lm = vanilla_transformer_lm(11, num_layers=1, d_model=8, num_heads=2,
                                d_ff=16, max_sequence_length=6)
    with pytest.raises(TypeError, match="token_ids.*float32"):
        lm(np.ones((1, 4), "float32"))


def test_integer_inputs_model_saves_and_loads(tmp_path):
    """vanilla_transformer_lm is an IntegerInputsModel now: a .keras file
    keeps the class, the outputs and the refusal of float ids."""
    from keras_trm.models import IntegerInputsModel, vanilla_transformer_lm

    lm = vanilla_transformer_lm(11, num_layers=1, d_model=8, num_heads=2,
                                d_ff=16, max_sequence_length=6, dropout_rate=0.0)
    ids = np.ones((2, 6), "int32")
    lm.save(tmp_path / "lm.keras")
    back = keras.saving.load_model(tmp_path / "lm.keras")
    assert isinstance(back, IntegerInputsModel)
    np.testing.assert_allclose(to_numpy(back(ids)), to_numpy(lm(ids)), rtol=1e-6)
    with pytest.raises(TypeError, match="token_ids.*float32"):
        back(ids.astype("float32"))


@pytest.mark.parametrize("value", [-1.0, 0.0, float("nan"), float("inf")])
def test_layer_norm_epsilon_is_checked(value):
    """A negative or NaN epsilon made every output NaN."""
    from keras_trm.models import vanilla_transformer_lm

    for build in (lambda: TransformerEncoderBlock(2, 16, layer_norm_epsilon=value),
                  lambda: TransformerDecoderBlock(2, 16, layer_norm_epsilon=value),
                  lambda: transformer(20, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                                      layer_norm_epsilon=value),
                  lambda: vanilla_transformer_lm(11, num_layers=1, d_model=8, num_heads=2,
                                                 d_ff=16, layer_norm_epsilon=value)):
        with pytest.raises(ValueError, match="layer_norm_epsilon"):
            build()
    with pytest.raises(TypeError, match="layer_norm_epsilon"):
        TransformerEncoderBlock(2, 16, layer_norm_epsilon="abc")
    from keras_trm.layers import LSTM_LN

    with pytest.raises(ValueError, match="epsilon"):  # inf passed before
        LSTM_LN(4, epsilon=value)


def test_model_dropout_rate_is_named():
    """Keras' own Dropout check ran first and named `rate`."""
    with pytest.raises(ValueError, match="dropout_rate=-0.1"):
        transformer(20, num_layers=1, d_model=8, num_heads=2, d_ff=16, dropout_rate=-0.1)


def test_attention_input_shapes_are_checked():
    """Batch 1 broadcast against batch 2 under JAX and PyTorch (Keras'
    own layer refuses it under TensorFlow only), and a built layer took
    rank-2 inputs that its docstring refuses."""
    from keras_trm.layers import MultiHeadAttention

    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    mha = MultiHeadAttention(2, 4)
    mha(x, x)
    with pytest.raises(ValueError, match="batch sizes"):
        mha(x, x[:1])
    with pytest.raises(ValueError, match="batch sizes"):
        mha(x[:1], x)
    with pytest.raises(ValueError, match="rank"):
        mha(x[0], x[0])


def test_masks_of_the_wrong_shape_are_refused():
    """A (T,) padding mask was read as one mask per query (silently); a
    mask of the wrong length failed deep in the backend."""
    from keras_trm.layers import MultiHeadAttention

    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    block = TransformerEncoderBlock(2, 16, dropout_rate=0.0)
    block(x)
    with pytest.raises(ValueError, match=r"padding_mask.*\(2, 5\).*\(5,\)"):
        block(x, padding_mask=np.array([1, 1, 1, 0, 0], bool))
    decoder = TransformerDecoderBlock(2, 16, dropout_rate=0.0)
    decoder(x, x)
    with pytest.raises(ValueError, match="encoder_padding_mask"):
        decoder(x, x, encoder_padding_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="decoder_padding_mask"):
        decoder(x, x, decoder_padding_mask=np.ones((5,), bool))
    mha = MultiHeadAttention(2, 4)
    mha(x, x)
    with pytest.raises(ValueError, match="query_mask"):
        mha(x, x, query_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="value_mask"):
        mha(x, x, value_mask=np.ones((2, 6), bool))
    with pytest.raises(ValueError, match="attention_mask"):
        mha(x, x, attention_mask=np.ones((2, 5, 4), bool))
    mha(x, x, attention_mask=np.ones((2, 1, 5), bool))  # broadcast: fine


def test_relative_attention_and_lstm_ln_inputs_are_checked():
    """Each of these failed deep in the backend (or, for a float length,
    gave 4 rows for 3.5; mem_len was read only with same_length)."""
    from keras_trm.layers import LSTM_LN, RelativeMultiHeadAttention
    from keras_trm.layers.relative_attention import (
        rel_shift, relative_position_encoding)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    ra = RelativeMultiHeadAttention(num_heads=2, key_dim=4)
    ra(x, x)
    with pytest.raises(ValueError, match="rank 3"):
        ra(x[0], x[0])
    with pytest.raises(ValueError, match="one key per value"):
        ra(x, x, key=x[:, :4])
    with pytest.raises(ValueError, match="batch sizes"):
        ra(x, x[:1])
    with pytest.raises(ValueError, match="attention_mask"):
        ra(x, x, attention_mask=np.ones((2, 5, 4), bool))
    for mem_len in ("abc", -3):
        with pytest.raises((TypeError, ValueError), match="mem_len"):
            ra(x, x, mem_len=mem_len)
    assert tuple(relative_position_encoding(np.int64(3), 8).shape) == (3, 8)
    with pytest.raises(ValueError, match="length"):
        relative_position_encoding(np.int64(-1), 8)
    with pytest.raises(TypeError, match="length"):
        relative_position_encoding(3.5, 8)
    with pytest.raises(ValueError, match="K >= T"):
        rel_shift(np.zeros((4, 3), "float32"))

    lstm = LSTM_LN(4)
    lstm(x)
    with pytest.raises(ValueError, match="initial_state"):
        lstm(x, initial_state=[np.zeros((2, 4), "float32")])
    with pytest.raises(ValueError, match=r"initial_state\[1\]"):
        lstm(x, initial_state=[np.zeros((2, 4), "float32"), np.zeros((2, 3), "float32")])
    with pytest.raises(ValueError, match="mask"):
        lstm(x, mask=np.ones((2, 3), bool))
