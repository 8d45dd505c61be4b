"""Streaming translation data (keras_trm.data.shards), the one input
pipeline of translation training, on real Multi30k pairs: prepared shards
hold the job's ids (also from pairs held in memory, shards_from_pairs), an
epoch streams every pair once in batches of at most tokens_per_batch
(also split over workers), weights set corpus shares, iterators resume
exactly, and preparations are reused only when complete and current."""

import collections
import gzip
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_trm.data.shards import (
    MANIFEST,
    PAIR_FILES,
    mix_batches,
    prepare_shards,
    read_manifest,
    shards_from_pairs,
    stream_batches,
    stream_steps,
)
from keras_trm.text import END_ID, START_ID

BOUNDARIES = (8, 12, 16, 20, 24, 32)
MAX_LENGTH = 32
TOKENS = 256


def _write(path, lines):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return path


def _reference(tokenizer, sources, targets, max_length=MAX_LENGTH):
    """The job's ids (jobs/translation.py `_run`): blank pairs dropped,
    source + END, START + target + END, pairs over max_length dropped."""
    pairs = [(s, t) for s, t in zip(sources, targets) if s.strip() and t.strip()]
    src = tokenizer.tokenize(tf.constant([p[0] for p in pairs])).to_list()
    tgt = tokenizer.tokenize(tf.constant([p[1] for p in pairs])).to_list()
    out = []
    for s, t in zip(src, tgt):
        s, t = s + [END_ID], [START_ID] + t + [END_ID]
        if len(s) <= max_length and len(t) <= max_length:
            out.append((tuple(s), tuple(t)))
    return out


def _decode_shards(manifest):
    out = []
    for shard in manifest["shards"]:
        path = os.path.join(manifest["directory"], shard["file"])
        for record in tf.data.TFRecordDataset(path):
            v = np.frombuffer(record.numpy(), "<i4")
            ns, nt = int(v[0]), int(v[1])
            assert len(v) == 2 + ns + nt
            out.append((tuple(v[2:2 + ns].tolist()),
                        tuple(v[2 + ns:].tolist())))
    return out


def _rows(dataset):
    """The non-padding rows of every batch as (source, target) id tuples,
    with START + target rebuilt from decoder tokens and labels; checks
    shapes and bucket choice on the way."""
    rows, shapes = [], []
    for x, y in dataset:
        enc, dec, lab = (x["encoder_tokens"].numpy(),
                         x["decoder_tokens"].numpy(), y.numpy())
        assert enc.dtype == dec.dtype == lab.dtype == np.int32
        batch, length = enc.shape
        assert length in BOUNDARIES and batch == TOKENS // length
        assert dec.shape == lab.shape == enc.shape
        shapes.append(enc.shape)
        for e, d, l in zip(enc, dec, lab):
            if not e.any():
                assert not d.any() and not l.any()  # an all-padding fill row
                continue
            s = tuple(e[e != 0].tolist())
            t = (START_ID,) + tuple(l[l != 0].tolist())
            assert tuple(d[d != 0].tolist()) == t[:-1]
            smallest = min(b for b in BOUNDARIES if b >= max(len(s), len(t) - 1))
            assert length == smallest
            rows.append((s, t))
    return rows, shapes


@pytest.fixture(scope="module")
def corpus(multi30k_small, tmp_path_factory):
    """600 real pairs as .gz files, with a blank line added."""
    src, tgt = multi30k_small
    src, tgt = list(src[:600]), list(tgt[:600])
    src[5] = "   "  # blank on one side: dropped like the job does
    folder = tmp_path_factory.mktemp("corpus")
    return (_write(folder / "train.en.gz", src), _write(folder / "train.de.gz", tgt),
            src, tgt)


@pytest.fixture(scope="module")
def prepared(corpus, tokenizer, tmp_path_factory):
    src_path, tgt_path, _, _ = corpus
    folder = tmp_path_factory.mktemp("shards")
    return prepare_shards(src_path, tgt_path, tokenizer, folder,
                          max_train_length=MAX_LENGTH, pairs_per_shard=128,
                          chunk_size=100)


def test_shards_round_trip_to_the_jobs_ids(corpus, tokenizer, prepared):
    _, _, src, tgt = corpus
    reference = _reference(tokenizer, src, tgt)
    assert _decode_shards(prepared) == reference  # same pairs, corpus order
    assert prepared["lines"] == 600 and prepared["blank"] == 1
    assert prepared["pairs"] == len(reference)
    assert prepared["too_long"] == 599 - len(reference) > 0
    assert len(prepared["shards"]) == -(-len(reference) // 128) >= 4
    assert [s["pairs"] for s in prepared["shards"]][:-1] == [128] * (
        len(prepared["shards"]) - 1)
    lengths = collections.Counter(max(len(s), len(t) - 1) for s, t in reference)
    counts = collections.Counter()
    for shard in prepared["shards"]:
        counts.update({n: c for n, c in enumerate(shard["length_counts"]) if c})
    assert counts == lengths
    assert prepared["max_pair_length"] == max(lengths)
    assert prepared["source_tokens"] == sum(len(s) for s, _ in reference)
    assert prepared["target_tokens"] == sum(len(t) - 1 for _, t in reference)


def test_limit_reads_only_the_first_lines(corpus, tokenizer, tmp_path):
    src_path, tgt_path, src, tgt = corpus
    manifest = prepare_shards(src_path, tgt_path, tokenizer, tmp_path / "s",
                              max_train_length=MAX_LENGTH, limit=50)
    assert manifest["lines"] == 50
    assert _decode_shards(manifest) == _reference(tokenizer, src[:50], tgt[:50])


def test_one_epoch_streams_every_pair_once_in_token_count_batches(
        corpus, tokenizer, prepared):
    """_rows checks every batch: one static (tokens_per_batch // L, L)
    shape per bucket (so at most tokens_per_batch tokens a side), the
    smallest bucket that holds the pair, teacher forcing, padding rows."""
    _, _, src, tgt = corpus
    reference = _reference(tokenizer, src, tgt)
    ds = stream_batches(prepared["directory"], TOKENS, BOUNDARIES, seed=3,
                        shuffle_buffer=100)
    rows, shapes = _rows(ds)
    assert collections.Counter(rows) == collections.Counter(reference)
    assert rows != reference  # shuffled
    assert len(shapes) == stream_steps(prepared, TOKENS, BOUNDARIES)
    # Per bucket: ceil(pairs / batch) batches, the last one short (padded).
    per_bucket = collections.Counter(
        min(b for b in BOUNDARIES if b >= max(len(s), len(t) - 1))
        for s, t in reference)
    assert collections.Counter(length for _, length in shapes) == {
        b: -(-n // (TOKENS // b)) for b, n in per_bucket.items()}
    assert ds.element_spec[1].dtype == tf.int32
    # Unshuffled: the same batches in the same order on every iteration.
    plain = stream_batches(prepared, TOKENS, BOUNDARIES, shuffle=False)
    assert _rows(plain) == _rows(plain)


def test_epochs_differ_and_repeat_is_seeded(prepared):
    ds = stream_batches(prepared, TOKENS, BOUNDARIES, seed=0, repeat=True,
                        shuffle_buffer=100)
    steps = stream_steps(prepared, TOKENS, BOUNDARIES)
    first = [y.numpy() for _, y in ds.take(2 * steps)]
    again = [y.numpy() for _, y in ds.take(2 * steps)]
    assert all((a == b).all() for a, b in zip(first, again))
    e0, e1 = first[:steps], first[steps:]
    assert any(a.shape != b.shape or (a != b).any() for a, b in zip(e0, e1))


def test_two_workers_read_disjoint_shards_that_cover_the_corpus(
        corpus, tokenizer, prepared):
    _, _, src, tgt = corpus
    reference = _reference(tokenizer, src, tgt)
    parts = []
    for worker in range(2):
        ds = stream_batches(prepared, TOKENS, BOUNDARIES, worker_index=worker,
                            num_workers=2, shuffle_buffer=100)
        rows, shapes = _rows(ds)
        assert len(shapes) == stream_steps(prepared, TOKENS, BOUNDARIES,
                                           worker_index=worker, num_workers=2)
        parts.append(collections.Counter(rows))
    assert parts[0] and parts[1]
    assert parts[0] + parts[1] == collections.Counter(reference)
    assert not set(parts[0]) & set(parts[1]) - {p for p, c in collections.Counter(
        reference).items() if c > 1}
    with pytest.raises(ValueError, match="workers but"):
        stream_batches(prepared, TOKENS, BOUNDARIES, worker_index=0,
                       num_workers=len(prepared["shards"]) + 1)
    with pytest.raises(ValueError, match="worker_index"):
        stream_batches(prepared, TOKENS, BOUNDARIES, worker_index=2, num_workers=2)


def test_weights_set_the_corpus_shares(multi30k_small, tokenizer, tmp_path):
    src, tgt = multi30k_small
    manifests, sets = [], []
    for i, (lo, hi) in enumerate(((0, 300), (1000, 1300))):
        s = _write(tmp_path / f"c{i}.en", src[lo:hi])
        t = _write(tmp_path / f"c{i}.de", tgt[lo:hi])
        manifests.append(prepare_shards(s, t, tokenizer, tmp_path / f"s{i}",
                                        max_train_length=MAX_LENGTH, pairs_per_shard=64))
        sets.append(set(_reference(tokenizer, src[lo:hi], tgt[lo:hi])))
    draws = 4000
    rows, _ = _rows(mix_batches(manifests, [1, 3], TOKENS, BOUNDARIES, seed=5,
                                repeat=False, pairs_per_epoch=draws,
                                shuffle_buffer=50))
    assert len(rows) == draws  # every drawn pair in exactly one batch
    origin = collections.Counter(
        (r in sets[0], r in sets[1]) for r in rows)
    share = origin[(False, True)] / (origin[(True, False)] + origin[(False, True)])
    # Each draw is Bernoulli(3/4): standard deviation sqrt(.75 * .25 / 4000)
    # = 0.0068, so 0.03 is more than 4 of them (and the draw is seeded).
    assert origin[(False, False)] == 0
    assert abs(share - 0.75) < 0.03
    rows, _ = _rows(mix_batches(manifests, [1, 0], TOKENS, BOUNDARIES,
                                repeat=False, pairs_per_epoch=500))
    assert all(r in sets[0] for r in rows)
    # The small corpus (weight 3) is seen several times: 4000 * 3/4 draws.
    assert len(sets[1]) < 300 < 0.75 * draws
    with pytest.raises(ValueError, match="weights"):
        mix_batches(manifests, [1], TOKENS, BOUNDARIES)


def test_an_iterator_checkpoint_resumes_mid_shard_with_exactly_the_rest(
        prepared, tmp_path):
    ds = stream_batches(prepared, TOKENS, BOUNDARIES, seed=1, repeat=True,
                        shuffle_buffer=50, cycle_length=2)
    steps = stream_steps(prepared, TOKENS, BOUNDARIES)
    it = iter(ds)
    seen = [next(it)[1].numpy() for _ in range(5)]
    # 5 batches hold fewer pairs than one 128-pair shard: mid shard.
    assert sum(int((y != 0).any(1).sum()) for y in seen) < 128
    path = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "data"))
    rest = [next(it)[1].numpy() for _ in range(steps + 3)]  # into epoch 2
    resumed = iter(ds)
    tf.train.Checkpoint(iterator=resumed).read(path).assert_consumed()
    again = [next(resumed)[1].numpy() for _ in range(steps + 3)]
    assert [a.shape for a in rest] == [b.shape for b in again]
    assert all((a == b).all() for a, b in zip(rest, again))


def test_a_mixture_iterator_resumes_too(prepared, tmp_path):
    ds = mix_batches([prepared, prepared], [1, 2], TOKENS, BOUNDARIES, seed=4,
                     shuffle_buffer=50)
    it = iter(ds)
    for _ in range(4):
        next(it)
    path = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "mix"))
    rest = [next(it)[1].numpy() for _ in range(6)]
    resumed = iter(ds)
    tf.train.Checkpoint(iterator=resumed).read(path).assert_consumed()
    assert all((a == next(resumed)[1].numpy()).all() for a in rest)
    skipped = iter(mix_batches([prepared, prepared], [1, 2], TOKENS, BOUNDARIES,
                               seed=4, shuffle_buffer=50, skip_batches=4))
    assert all((a == next(skipped)[1].numpy()).all() for a in rest)


def test_a_mixture_resumes_from_a_job_position(prepared):
    """The job's resume: ``position`` (epoch, skip), read when iteration
    starts, gives the uninterrupted stream from batch epoch * steps + skip;
    ``mix_steps`` counts the batches of one mixture epoch."""
    from keras_trm.data.shards import mix_steps
    from keras_trm.training import DataPosition

    steps = mix_steps([prepared, prepared], [1, 2], TOKENS, BOUNDARIES)
    # Same corpus twice, so the expected mixture epoch is that corpus' own
    # length distribution twice over (up to the ceiling of each bucket).
    one = stream_steps(prepared, TOKENS, BOUNDARIES)
    assert 2 * one - len(BOUNDARIES) <= steps <= 2 * one + len(BOUNDARIES)
    full = [y.numpy() for _, y in mix_batches(
        [prepared, prepared], [1, 2], TOKENS, BOUNDARIES, seed=4,
        shuffle_buffer=50).take(steps + 8)]
    position = DataPosition()
    ds = mix_batches([prepared, prepared], [1, 2], TOKENS, BOUNDARIES, seed=4,
                     shuffle_buffer=50, position=position, batches_per_epoch=steps)
    position.epoch, position.skip = 1, 3
    late = [y.numpy() for _, y in ds.take(5)]
    assert all((a == b).all() for a, b in zip(full[steps + 3:], late))
    with pytest.raises(ValueError, match="batches_per_epoch"):
        mix_batches([prepared], [1], TOKENS, BOUNDARIES, position=position)


def test_start_epoch_and_skip_give_the_uninterrupted_batches(prepared):
    from keras_trm.training import DataPosition

    steps = stream_steps(prepared, TOKENS, BOUNDARIES)
    full = [y.numpy() for _, y in stream_batches(
        prepared, TOKENS, BOUNDARIES, seed=2, repeat=True,
        shuffle_buffer=50).take(2 * steps)]
    late = [y.numpy() for _, y in stream_batches(
        prepared, TOKENS, BOUNDARIES, seed=2, repeat=True, shuffle_buffer=50,
        start_epoch=1, skip_batches=3).take(steps - 3)]
    assert all((a == b).all() for a, b in zip(full[steps + 3:], late))
    position = DataPosition()
    ds = stream_batches(prepared, TOKENS, BOUNDARIES, seed=2, repeat=True,
                        shuffle_buffer=50, position=position)
    position.epoch, position.skip = 1, 3  # set after building, read at iter()
    lazy = [y.numpy() for _, y in ds.take(steps - 3)]
    assert all((a == b).all() for a, b in zip(full[steps + 3:], lazy))


def test_prepared_files_are_reused_and_rewritten_when_the_corpus_changes(
        multi30k_small, tokenizer, tmp_path):
    src, tgt = multi30k_small
    s = _write(tmp_path / "a.en.gz", src[:200])
    t = _write(tmp_path / "a.de.gz", tgt[:200])
    folder = tmp_path / "shards"
    first = prepare_shards(s, t, tokenizer, folder, max_train_length=MAX_LENGTH,
                           pairs_per_shard=64)
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    second = prepare_shards(s, t, tokenizer, folder, max_train_length=MAX_LENGTH,
                            pairs_per_shard=64)
    assert not first["reused"] and second["reused"]
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
    assert second["key"] == first["key"]

    _write(s, src[:150])  # the corpus changes: fewer lines
    _write(t, tgt[:150])
    third = prepare_shards(s, t, tokenizer, folder, max_train_length=MAX_LENGTH,
                           pairs_per_shard=64)
    assert not third["reused"] and third["key"] != first["key"]
    assert third["lines"] == 150
    assert _decode_shards(third) == _reference(tokenizer, src[:150], tgt[:150])
    assert sorted(p.name for p in folder.glob("shard-*")) == [
        sh["file"] for sh in third["shards"]]  # the old extra shard is gone
    assert not list(folder.glob(".shard-*"))  # no temporary left
    # Another max_train_length is another key, too.
    assert not prepare_shards(s, t, tokenizer, folder, max_train_length=24,
                              pairs_per_shard=64)["reused"]


def test_the_old_max_length_still_works_and_old_preparations_are_reused(
        multi30k_small, tokenizer, tmp_path):
    """``max_length`` (before ``max_train_length``, issue #41): the same
    filter with a DeprecationWarning; a folder prepared before the rename
    (its manifest says ``max_length``) is reused, its manifest read with the
    new name."""
    import json

    src, tgt = multi30k_small
    s = _write(tmp_path / "a.en", src[:100])
    t = _write(tmp_path / "a.de", tgt[:100])
    folder = tmp_path / "shards"
    new = prepare_shards(s, t, tokenizer, folder, max_train_length=24)
    assert new["max_train_length"] == 24 and "max_length" not in new
    with pytest.deprecated_call(match="`max_length` is now `max_train_length`"):
        old = prepare_shards(s, t, tokenizer, folder, max_length=24)
    assert old["reused"] and old["key"] == new["key"]
    with pytest.deprecated_call(match="max_train_length"):
        memory = shards_from_pairs(src[:100], tgt[:100], tokenizer,
                                   tmp_path / "memory", max_length=24)
    assert memory["too_long"] == new["too_long"]
    # A manifest written before the rename: the same key, the old name.
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["max_length"] = manifest.pop("max_train_length")
    (folder / MANIFEST).write_text(json.dumps(manifest))
    again = prepare_shards(s, t, tokenizer, folder, max_train_length=24)
    assert again["reused"] and again["max_train_length"] == 24
    assert "max_length" not in again
    with pytest.raises(ValueError, match="max_train_length=1"):
        prepare_shards(s, t, tokenizer, folder, max_train_length=1)


def test_a_partial_preparation_is_not_reused(multi30k_small, tokenizer, tmp_path):
    src, tgt = multi30k_small
    s = _write(tmp_path / "a.en", src[:200])
    t = _write(tmp_path / "a.de", tgt[:200])
    folder = tmp_path / "shards"
    good = prepare_shards(s, t, tokenizer, folder, max_train_length=MAX_LENGTH,
                          pairs_per_shard=64)
    reference = _decode_shards(good)
    # Interrupted before the manifest: shards present, no manifest.
    (folder / MANIFEST).unlink()
    shard = folder / good["shards"][1]["file"]
    shard.write_bytes(shard.read_bytes()[:100])  # and one cut short
    assert read_manifest(folder) is None
    with pytest.raises(ValueError, match="no complete preparation"):
        stream_batches(folder, TOKENS, BOUNDARIES)
    again = prepare_shards(s, t, tokenizer, folder, max_train_length=MAX_LENGTH,
                           pairs_per_shard=64)
    assert not again["reused"] and _decode_shards(again) == reference
    # A manifest whose shard was truncated later is not reused either.
    shard.write_bytes(shard.read_bytes()[:100])
    assert read_manifest(folder) is None
    assert not prepare_shards(s, t, tokenizer, folder, max_train_length=MAX_LENGTH,
                              pairs_per_shard=64)["reused"]


def test_errors_name_the_problem(multi30k_small, tokenizer, tmp_path, prepared):
    src, tgt = multi30k_small
    s = _write(tmp_path / "a.en", src[:10])
    t = _write(tmp_path / "a.de", tgt[:9])
    with pytest.raises(ValueError, match="line counts differ"):
        prepare_shards(s, t, tokenizer, tmp_path / "x")
    assert read_manifest(tmp_path / "x") is None
    with pytest.raises(FileNotFoundError):
        prepare_shards(tmp_path / "missing.en", t, tokenizer, tmp_path / "y")
    with pytest.raises(ValueError, match="exceeds the last bucket"):
        stream_batches(prepared, TOKENS, (8, 12))
    with pytest.raises(ValueError, match="smaller than the bucket boundary"):
        stream_batches(prepared, 16, BOUNDARIES)


def test_sentencepiece_ids_round_trip(multi30k_small, tmp_path):
    from keras_trm.text import SentencePieceTokenizer, learn_sentencepiece

    src, tgt = multi30k_small
    model = learn_sentencepiece(src[:1000] + tgt[:1000], 600,
                                tmp_path / "sp.model", num_threads=1)
    tok = SentencePieceTokenizer(model)
    s = _write(tmp_path / "a.en", src[:150])
    t = _write(tmp_path / "a.de", tgt[:150])
    manifest = prepare_shards(s, t, tok, tmp_path / "shards",
                              max_train_length=MAX_LENGTH, pairs_per_shard=50)
    assert _decode_shards(manifest) == _reference(tok, src[:150], tgt[:150])
    import hashlib
    assert manifest["tokenizer"] == hashlib.sha256(model.read_bytes()).hexdigest()


def test_pairs_in_memory_go_through_the_same_shards(corpus, tokenizer, prepared,
                                                    tmp_path):
    """shards_from_pairs (the README's, the notebooks' and the tests' way in)
    gives the shards, manifest and batches of prepare_shards over the same
    lines on disk; generators work; the same pairs again reuse the files."""
    _, _, src, tgt = corpus
    common = dict(max_train_length=MAX_LENGTH, pairs_per_shard=128, chunk_size=100)
    memory = shards_from_pairs(src, tgt, tokenizer, tmp_path / "mem", **common)
    assert _decode_shards(memory) == _decode_shards(prepared)
    for key in ("lines", "blank", "too_long", "pairs", "source_tokens",
                "target_tokens", "max_pair_length", "tokenizer"):
        assert memory[key] == prepared[key], key
    assert [s["length_counts"] for s in memory["shards"]] == [
        s["length_counts"] for s in prepared["shards"]]
    assert not memory["reused"]
    assert sorted(p.name for p in (tmp_path / "mem").iterdir()) == sorted(
        [MANIFEST, *PAIR_FILES, *(s["file"] for s in memory["shards"])])

    def labels(shards):
        return [y.numpy() for _, y in stream_batches(
            shards, TOKENS, BOUNDARIES, seed=3, shuffle_buffer=100)]

    same, want = labels(memory), labels(prepared)
    assert len(same) == len(want) and all(
        a.shape == b.shape and (a == b).all() for a, b in zip(same, want))

    # Generators, read once in step, in chunks of 7 pairs.
    streamed = shards_from_pairs(iter(src), (t for t in tgt), tokenizer,
                                 tmp_path / "gen", **dict(common, chunk_size=7))
    assert _decode_shards(streamed) == _decode_shards(prepared)

    folder = tmp_path / "mem"
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    again = shards_from_pairs(list(src), list(tgt), tokenizer, folder, **common)
    assert again["reused"] and again["key"] == memory["key"]
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
    other = shards_from_pairs(src[:100], tgt[:100], tokenizer, folder, **common)
    assert not other["reused"] and other["lines"] == 100
    assert _decode_shards(other) == _reference(tokenizer, src[:100], tgt[:100])
    assert not list(folder.glob(".*"))  # no temporary left


def test_pairs_in_memory_default_to_a_temporary_folder(multi30k_small,
                                                       tokenizer):
    import tempfile

    src, tgt = multi30k_small
    shards = shards_from_pairs(src[:50], tgt[:50], tokenizer,
                               max_train_length=MAX_LENGTH)
    folder = shards["directory"]
    assert os.path.dirname(folder) == tempfile.gettempdir()
    assert read_manifest(folder)["pairs"] == shards["pairs"] > 0
    rows, _ = _rows(stream_batches(shards, TOKENS, BOUNDARIES))
    assert collections.Counter(rows) == collections.Counter(
        _reference(tokenizer, src[:50], tgt[:50]))
    # Another call, another folder.
    assert shards_from_pairs(src[:50], tgt[:50], tokenizer,
                             max_train_length=MAX_LENGTH)["directory"] != folder


def test_pairs_in_memory_errors_name_the_problem(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="differ in length: 2 vs 1"):
        shards_from_pairs(["a", "b"], ["a"], tokenizer, tmp_path / "a")
    with pytest.raises(ValueError, match="`targets` ends after 1 strings"):
        shards_from_pairs(iter(["a", "b"]), iter(["a"]), tokenizer,
                          tmp_path / "b")
    with pytest.raises(ValueError, match="source 1 holds a line break"):
        shards_from_pairs(["a", "b\nc"], ["a", "b"], tokenizer, tmp_path / "c")
    with pytest.raises(TypeError, match="target 0 is a list, not a str"):
        shards_from_pairs(["a"], [[4, 5]], tokenizer, tmp_path / "d")
    with pytest.raises(ValueError, match="no pair"):
        shards_from_pairs(["", " "], ["a", "b"], tokenizer, tmp_path / "e")
    with pytest.raises(ValueError, match="chunk_size"):
        shards_from_pairs(["a"], ["b"], tokenizer, tmp_path / "f", chunk_size=0)
    for name in "abcdef":
        assert read_manifest(tmp_path / name) is None
        assert not list((tmp_path / name).glob(".pairs-*"))  # temporaries gone


def test_the_removed_generator_pipeline_names_its_replacement():
    import keras_trm.data

    with pytest.raises(ImportError, match="shards_from_pairs.*stream_batches"):
        from keras_trm.data import token_bucket_batches  # noqa: F401
    with pytest.raises(ImportError, match="shards_from_pairs"):
        keras_trm.data.token_bucket_batches
    assert not hasattr(keras_trm.data, "no_such_name")
