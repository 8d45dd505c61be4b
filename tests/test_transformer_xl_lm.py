"""Transformer-XL language model (Dai et al. 2019): shapes, memories without
gradient, segment-by-segment = full pass, .keras round trip, the vanilla
baseline and its sliding-window evaluation, PTB / Tiny Shakespeare data
helpers, a short real-data training run and argument errors."""

import collections
import itertools
import tracemalloc

import keras_trm  # noqa: F401  (checks the TensorFlow backend first)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from conftest import assert_allclose, assert_array_equal, to_np
from keras_trm.data import language_modeling as lm  # noqa: E402
from keras_trm.decoding import (  # noqa: E402
    evaluate_sliding_window,
    evaluate_with_memory,
)
from keras_trm.models.transformer_xl import (  # noqa: E402
    TransformerXLLM,
    vanilla_transformer_lm,
)
from keras_trm.training import lm_loss  # noqa: E402

pytestmark = pytest.mark.portable  # CI runs it under each backend
VOCAB, D_MODEL, LAYERS, HEADS, D_FF = 37, 16, 2, 2, 32


def tiny_xl(**kwargs):
    config = dict(num_layers=LAYERS, d_model=D_MODEL, num_heads=HEADS,
                  d_ff=D_FF, mem_len=8, max_segment_len=24, dropout_rate=0.0)
    config.update(kwargs)
    return TransformerXLLM(VOCAB, **config)


def random_ids(shape, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, shape).astype(
        np.int32
    )


# -- model -------------------------------------------------------------------
def test_shapes_and_new_memories():
    model = tiny_xl(mem_len=5)
    x = random_ids((3, 4))
    logits, mems = model(x)
    assert logits.shape == (3, 4, VOCAB) and keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert len(mems) == LAYERS
    # Fewer than mem_len positions seen so far: the memory holds all 4.
    assert all(tuple(m.shape) == (3, 4, D_MODEL) for m in mems)
    # Layer 0's memory is its input: the scaled embedding (dropout off).
    emb = model.embed(x, training=False)
    assert_allclose(mems[0], emb, atol=1e-6)
    logits2, mems2 = model(random_ids((3, 4), 1), mems)
    assert logits2.shape == (3, 4, VOCAB)
    assert all(tuple(m.shape) == (3, 5, D_MODEL) for m in mems2)
    # The newest 4 positions of the layer-0 memory are the new segment's input.
    assert_allclose(mems2[0][:, 1:], model.embed(
        random_ids((3, 4), 1), training=False), atol=1e-6)
    assert_allclose(mems2[0][:, :1], mems[0][:, -1:], atol=1e-6)
    # Empty memories behave as no memory.
    empty = model.init_memories(3)
    assert tuple(empty[0].shape) == (3, 0, D_MODEL)
    assert_allclose(model(x, empty)[0], logits, atol=1e-6)


@pytest.mark.tensorflow  # tf.GradientTape
def test_no_gradient_into_memories():
    model = tiny_xl(dropout_rate=0.1)
    x = random_ids((2, 5))
    mems = [tf.random.normal((2, 6, D_MODEL), seed=i) for i in range(LAYERS)]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(mems)
        logits, new_mems = model(x, mems, training=True)
        loss = lm_loss(random_ids((2, 5), 3), logits)
        mem_sum = tf.add_n([tf.reduce_sum(m) for m in new_mems])
    assert all(g is None for g in tape.gradient(loss, mems))
    weight_grads = tape.gradient(loss, model.trainable_variables)
    assert sum(g is not None for g in weight_grads) > 0
    # New memories are stop-gradient too (their source, the embedding,
    # receives nothing through them).
    assert all(
        g is None for g in tape.gradient(mem_sum, model.trainable_variables)
    )
    assert all(g is None for g in tape.gradient(mem_sum, mems))


@pytest.mark.parametrize("kwargs", [{}, {"untie_biases": False,
                                         "norm_first": True}])
def test_segments_with_memory_equal_full_pass(kwargs):
    length, seg = 18, 6
    model = tiny_xl(mem_len=length, max_segment_len=length, **kwargs)
    if not kwargs:
        # Non-zero u, v so that the global biases take part.
        for block in model.blocks:
            att = block.self_attention
            att.content_bias.assign(keras.random.normal(att.content_bias.shape))
            att.position_bias.assign(keras.random.normal(att.position_bias.shape))
    else:
        model.content_bias.assign(keras.random.normal(model.content_bias.shape))
        model.position_bias.assign(keras.random.normal(model.position_bias.shape))
    x = random_ids((2, length), 5)
    full = to_np(model(x)[0])
    mems, pieces = None, []
    for start in range(0, length, seg):
        out, mems = model(x[:, start:start + seg], mems)
        pieces.append(to_np(out))
    assert_allclose(
        np.concatenate(pieces, axis=1), full, atol=1e-4, rtol=1e-4
    )
    # With a too-short memory the later segments lose context and differ.
    short = tiny_xl(mem_len=2, max_segment_len=length, **kwargs)
    short.set_weights(model.get_weights())
    mems, pieces = None, []
    for start in range(0, length, seg):
        out, mems = short(x[:, start:start + seg], mems)
        pieces.append(to_np(out))
    assert_allclose(pieces[0], full[:, :seg], atol=1e-4)
    assert np.abs(np.concatenate(pieces, 1)[:, seg:] - full[:, seg:]).max() > 1e-3


# clamp_len=2 < mem_len - 1: the distances 2 and 3 of the window share R_2.
@pytest.mark.parametrize("clamp_len", [None, 2])
def test_set_mem_len_equals_a_model_built_with_it(clamp_len, tmp_path):
    """``set_mem_len`` changes every use of mem_len: the memories kept and
    the window of ``same_length`` (the mask and the banded path), as
    ``reset_length`` of the reference code. Three segments with carried
    memory give the logits of a model built with the new mem_len (before
    the fix the window stayed at 2 in the attention: off by ~1.5), and so
    do predict(), evaluate_with_memory and a .keras round trip, each
    traced with mem_len=2 first."""
    kwargs = dict(same_length=True, clamp_len=clamp_len)
    changed = tiny_xl(mem_len=2, **kwargs)
    built = tiny_xl(mem_len=4, **kwargs)
    built.set_weights(changed.get_weights())
    streams = random_ids((2, 3 * 16), 5)
    # Traced with mem_len=2: eager call, predict() and the evaluation step.
    before = changed(streams[:, :16])[0]
    changed.predict(streams[:, :16], verbose=0)
    evaluate_with_memory(changed, streams, 16)
    changed.set_mem_len(4)
    mems_a, mems_b = changed.init_memories(2), built.init_memories(2)
    for start in range(0, streams.shape[1], 16):
        # segment 1: dense scores (K=16); 2 and 3: key windows (K=20)
        segment = streams[:, start:start + 16]
        logits_a, mems_a = changed(segment, mems_a)
        logits_b, mems_b = built(segment, mems_b)
        assert_allclose(logits_a, logits_b, atol=1e-5)
        assert [m.shape[1] for m in mems_a] == [m.shape[1] for m in mems_b]
    assert_allclose(
        changed.predict(streams[:, :16], verbose=0)[0],
        built.predict(streams[:, :16], verbose=0)[0], atol=1e-5)
    assert_allclose(evaluate_with_memory(changed, streams, 16),
                               evaluate_with_memory(built, streams, 16),
                               rtol=1e-6)
    # the window really changed: mem_len 2 and 4 differ on the first segment
    assert not np.allclose(to_np(before), to_np(built(streams[:, :16])[0]),
                           atol=1e-3)
    # One store: the blocks; the model reads it, the attentions hold none.
    assert changed.mem_len == 4 and changed.get_config()["mem_len"] == 4
    assert all(b.mem_len == 4 and b.self_attention.mem_len is None
               for b in changed.blocks)
    path = str(tmp_path / "changed.keras")
    changed.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.mem_len == 4
    assert_allclose(loaded(streams[:, 16:32], mems_b)[0],
                               built(streams[:, 16:32], mems_b)[0], atol=1e-5)


def test_evaluate_with_memory_matches_manual_loop():
    model = tiny_xl(mem_len=6)
    streams = random_ids((3, 23), 7)
    mems, total, count = model.init_memories(3), 0.0, 0
    for inputs, targets in lm.segments(streams, 5):
        logits, mems = model(inputs, mems)
        nll = keras.ops.sparse_categorical_crossentropy(
            targets, logits, from_logits=True)
        total += float(np.sum(to_np(nll)))
        count += targets.size
    assert count == 3 * 22
    got = evaluate_with_memory(model, streams, 5)
    assert got == pytest.approx(total / count, rel=1e-5)


def test_a_bfloat16_model_is_scored_in_float32():
    """A bfloat16 model's logits are summed in float32: the NLL of 1,024
    tokens equals the float64 sum of the same bfloat16 logits' NLLs."""
    from keras_trm.decoding.lm_evaluation import _summed_nll

    rng = np.random.default_rng(0)
    logits = keras.ops.cast(rng.normal(0, 3, (16, 64, 1000)), "bfloat16")
    targets = rng.integers(0, 1000, (16, 64)).astype("int32")
    reference = to_np(keras.ops.cast(logits, "float32")).astype(np.float64)
    reference = reference - reference.max(-1, keepdims=True)
    log_z = np.log(np.exp(reference).sum(-1))
    expected = float(np.sum(log_z - np.take_along_axis(
        reference, targets[..., None], -1)[..., 0]))
    total = _summed_nll(targets, logits)
    assert keras.backend.standardize_dtype(total.dtype) == "float32"
    assert float(total) == pytest.approx(expected, rel=1e-5)


def test_keras_round_trip(tmp_path):
    model = tiny_xl(untie_biases=False, norm_first=True, mem_len=4)
    model.content_bias.assign(keras.random.normal(model.content_bias.shape))
    x = random_ids((2, 5))
    mems = [keras.random.normal((2, 3, D_MODEL), seed=i) for i in range(LAYERS)]
    logits, new = model(x, mems)
    path = str(tmp_path / "xl.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, TransformerXLLM)
    assert loaded.get_config() == model.get_config()
    logits2, new2 = loaded(x, mems)
    assert_array_equal(logits2, logits)
    for a, b in zip(new, new2):
        assert_array_equal(a, b)


def test_vanilla_baseline_causal_and_round_trip(tmp_path):
    model = vanilla_transformer_lm(
        VOCAB, num_layers=LAYERS, d_model=D_MODEL, num_heads=HEADS,
        d_ff=D_FF, max_sequence_length=16, dropout_rate=0.0,
    )
    x = random_ids((2, 7))
    logits = model(x)
    assert logits.shape == (2, 7, VOCAB) and keras.backend.standardize_dtype(logits.dtype) == "float32"
    changed = x.copy()
    changed[:, 4:] = (changed[:, 4:] + 1) % VOCAB
    assert_allclose(model(changed)[:, :4], logits[:, :4], atol=1e-5)
    # Output tied to the embedding: the token table is the only
    # vocabulary-sized weight.
    assert [w.path for w in model.weights if VOCAB in w.shape] == [
        "embedding/embeddings"]
    path = str(tmp_path / "vanilla.keras")
    model.save(path)
    assert_array_equal(keras.saving.load_model(path)(x), logits)


def test_sliding_window_evaluation():
    model = vanilla_transformer_lm(
        VOCAB, num_layers=1, d_model=D_MODEL, num_heads=HEADS, d_ff=D_FF,
        max_sequence_length=8, dropout_rate=0.0,
    )
    streams = random_ids((2, 14), 11)
    ctx = 4
    nll = []
    for t in range(13):  # predict token t + 1 from the last <= ctx tokens
        window = streams[:, max(0, t - ctx + 1):t + 1]
        logits = model(window)[:, -1]
        nll.append(to_np(keras.ops.sparse_categorical_crossentropy(
            streams[:, t + 1], logits, from_logits=True)))
    nll = np.stack(nll, axis=1)  # (2, 13)
    assert evaluate_sliding_window(model, streams, ctx) == pytest.approx(
        nll.mean(), rel=1e-5)
    assert evaluate_sliding_window(
        model, streams, ctx, max_tokens=6) == pytest.approx(
        nll[:, :6].mean(), rel=1e-5)


# -- data --------------------------------------------------------------------
def test_batchify_and_segments():
    ids = np.arange(23)
    streams = lm.batchify(ids, 4)
    assert streams.shape == (4, 5) and streams.dtype == np.int32
    for b in range(4):  # row b is a contiguous piece of the corpus
        assert_array_equal(streams[b], np.arange(5 * b, 5 * b + 5))
    pairs = list(lm.segments(streams, 3))
    assert [p[0].shape for p in pairs] == [(4, 3), (4, 1)]
    for inputs, targets in pairs:
        assert_array_equal(targets, inputs + 1)
    assert_array_equal(  # consecutive segments continue each row
        np.concatenate([p[0] for p in pairs], 1), streams[:, :-1])
    assert len(list(lm.segments(streams, 3, drop_remainder=True))) == 1
    assert lm.num_segments(streams, 3) == 2


def test_vocabulary():
    vocab = lm.Vocabulary.from_corpus("abracadabra")
    assert vocab.tokens == ["a", "b", "r", "c", "d"]  # by count, then order
    ids = vocab.encode("cab")
    assert ids.dtype == np.int32 and "".join(vocab.decode(ids)) == "cab"
    with pytest.raises(ValueError, match="'z'"):
        vocab.encode("z")
    words = lm.Vocabulary.from_corpus(["x", "<unk>", "x"], reserved=["<eos>"])
    assert words.tokens == ["<eos>", "x", "<unk>"]
    assert_array_equal(words.encode(["new", "x"]), [2, 1])


def test_ptb_counts():
    counts = collections.Counter(lm.load_ptb("train"))
    assert sum(counts.values()) == 929_589
    assert counts["<eos>"] == 42_068
    assert len(counts) == 10_000
    assert sum(1 for _ in lm.load_ptb("valid")) == 73_760
    assert sum(1 for _ in lm.load_ptb("test")) == 82_430
    ids, vocab = lm.load_lm_corpus("ptb", "valid")
    assert len(vocab) == 10_000 and "<eos>" in vocab and "<unk>" in vocab
    assert ids.shape == (73_760,)
    assert vocab.decode(ids[:3]) == list(itertools.islice(
        lm.load_ptb("valid"), 3))
    # Ids by decreasing training count, ties in order of first occurrence.
    assert vocab.tokens[:3] == [t for t, _ in counts.most_common(3)]


def test_ptb_ids_are_made_without_holding_the_corpus():
    """Python objects at the peak of loading PTB's 929,589 training tokens:
    the int32 ids (3.6 MiB) and the 10,000-word vocabulary, not a list of
    the tokens (7 MiB of references alone, each token a str object)."""
    tracemalloc.start()
    try:
        ids, vocab = lm.load_lm_corpus("ptb", "train")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ids.shape == (929_589,) and len(vocab) == 10_000
    assert peak < ids.nbytes + 8 * 2**20, peak


def test_tiny_shakespeare_split():
    parts = [lm.load_tiny_shakespeare(s) for s in ("train", "valid", "test")]
    assert [len(p) for p in parts] == [1_003_854, 55_770, 55_770]
    assert sum(len(p) for p in parts) == 1_115_394
    assert parts[0].startswith("First Citizen:")
    _, vocab = lm.load_lm_corpus("tinyshakespeare", "train")
    assert len(vocab) == 65


# -- errors ------------------------------------------------------------------
def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="mem_len"):
        tiny_xl(mem_len=-1)
    with pytest.raises(ValueError, match="d_model"):
        tiny_xl(d_model=15, num_heads=3)
    with pytest.raises(ValueError, match="max_segment_len"):
        tiny_xl(max_segment_len=0)
    with pytest.raises(ValueError, match="mem_len"):
        tiny_xl().set_mem_len(-2)


def test_bad_call_arguments():
    model = tiny_xl(max_segment_len=6)
    x = random_ids((2, 4))
    with pytest.raises(ValueError, match=r"T=7.*max_segment_len=6"):
        model(random_ids((2, 7)))
    with pytest.raises(ValueError, match=r"token_ids.*\(batch, T\)"):
        model(random_ids((8,)))
    with pytest.raises(TypeError, match="token_ids"):
        model(np.zeros((2, 4), np.float32))
    mem = np.zeros((2, 3, D_MODEL), np.float32)
    with pytest.raises(ValueError, match=r"num_layers=2.*list of 1"):
        model(x, [mem])
    with pytest.raises(ValueError, match=r"memories\[1\].*\(3, 3, 16\)"):
        model(x, [mem, np.zeros((3, 3, D_MODEL), np.float32)])
    with pytest.raises(ValueError, match=r"memories\[0\].*\(2, 3, 8\)"):
        model(x, [np.zeros((2, 3, 8), np.float32), mem])
    with pytest.raises(ValueError, match="same length"):
        model(x, [mem, np.zeros((2, 5, D_MODEL), np.float32)])
    with pytest.raises(ValueError, match="seg_len"):
        evaluate_with_memory(model, random_ids((2, 20)), 7)
    vanilla = vanilla_transformer_lm(VOCAB, num_layers=1, d_model=D_MODEL,
                                     num_heads=HEADS, d_ff=D_FF, max_sequence_length=8)
    with pytest.raises(ValueError, match="context_len"):
        evaluate_sliding_window(vanilla, random_ids((2, 20)), 9)


def test_bad_data_arguments(tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        lm.batchify(np.arange(10), 0)
    with pytest.raises(ValueError, match="batch_size=11"):
        lm.batchify(np.arange(10), 11)
    with pytest.raises(ValueError, match="ids.shape"):
        lm.batchify(np.zeros((2, 5)), 2)
    with pytest.raises(ValueError, match="streams.shape"):
        list(lm.segments(np.arange(10), 3))
    with pytest.raises(ValueError, match="seg_len"):
        list(lm.segments(np.zeros((2, 5)), 0))
    with pytest.raises(ValueError, match="split"):
        lm.load_ptb("validation", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"ptb\.test\.txt"):
        lm.load_ptb("test", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"input\.txt"):
        lm.load_tiny_shakespeare("train", data_dir=tmp_path)
    with pytest.raises(ValueError, match="name"):
        lm.load_lm_corpus("wikitext", "train", data_dir=tmp_path)


def test_download_fetches_official_layout(tmp_path, monkeypatch):
    """download=True fetches the official archives (here the same files
    served from file:// URLs built from the shared data, since CI is
    offline) and gives the same tokens as the local copies."""
    import gzip
    import io
    import tarfile

    source = tmp_path / "source"
    source.mkdir()
    with tarfile.open(source / "simple-examples.tgz", "w:gz") as tar:
        for split in lm.PTB_SPLITS:
            shared = lm.resolve_data_dir() / "ptb" / f"ptb.{split}.txt.gz"
            data = gzip.decompress(shared.read_bytes())
            info = tarfile.TarInfo(f"./simple-examples/data/ptb.{split}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    shakespeare = lm.resolve_data_dir() / "tinyshakespeare" / "input.txt"
    (source / "input.txt").write_bytes(shakespeare.read_bytes())
    monkeypatch.setattr(lm, "PTB_URL", (source / "simple-examples.tgz").as_uri())
    monkeypatch.setattr(lm, "SHAKESPEARE_URL", (source / "input.txt").as_uri())

    target = tmp_path / "data"
    with pytest.raises(FileNotFoundError, match="download=True"):
        lm.load_ptb("valid", data_dir=tmp_path)
    assert list(lm.load_ptb("valid", data_dir=target, download=True)) == list(
        lm.load_ptb("valid"))
    assert sorted(p.name for p in (target / "ptb").iterdir()) == [
        "ptb.test.txt", "ptb.train.txt", "ptb.valid.txt"]
    assert lm.load_tiny_shakespeare("test", data_dir=target, download=True) == (
        lm.load_tiny_shakespeare("test"))
    assert [p.name for p in (target / "tinyshakespeare").iterdir()] == [
        "input.txt"]
