"""The one prepared format (keras_trm.data.prepared) and its loader
(keras_trm.data.loader.TokenBatches) on real Multi30k pairs and a real
SentencePiece vocabulary: the ids round trip, an epoch holds every pair
once in static-shape token-count batches, the order is a pure function of
(seed, epoch), ``position`` resumes exactly, processes split each global
batch, weights set corpus shares, a folder is reused only under its key,
an interrupted preparation keeps the previous folder, damaged folders are
refused naming the file, and ``fit`` learns from the batches on every
backend."""

import collections
import gzip
import json
import shutil
import types

import keras
import numpy as np
import pytest

from keras_trm.data.loader import TokenBatches, bucket_boundaries, parse_boundaries
from keras_trm.data.prepared import (
    MANIFEST,
    MIB,
    prepare_translation_data,
    read_prepared,
    sha256_file,
)
from keras_trm.utils.ids import END_ID, START_ID

BOUNDARIES = (8, 12, 16, 24, 32)  # each divides TOKENS (see the process test)
MAX_LENGTH = 32
TOKENS = 96
MAX_FILE_MIB = 4096 / MIB  # the smallest chunk files: many chunks per split
TRAIN_LINES, VAL_LINES = 400, 300


pytestmark = pytest.mark.portable  # CI runs it under each backend


def _write(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def spm(multi30k_small, tmp_path_factory):
    """A real SentencePiece vocabulary learned on 2,000 Multi30k pairs:
    (encode, vocabulary size, SHA-256 of the model file)."""
    import sentencepiece

    from keras_trm.text import learn_sentencepiece

    src, tgt = multi30k_small
    path = learn_sentencepiece(list(src) + list(tgt), 1000,
                               tmp_path_factory.mktemp("spm") / "spm.model",
                               num_threads=1)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    return types.SimpleNamespace(encode=processor.encode,
                                 size=processor.get_piece_size(),
                                 sha256=sha256_file(path))


@pytest.fixture(scope="module")
def corpus(multi30k_small, data_dir, tmp_path_factory):
    """400 real training pairs (one made blank) and 300 validation pairs,
    as .gz files."""
    from keras_trm.data import load_multi30k

    src, tgt = (list(x[:TRAIN_LINES]) for x in multi30k_small)
    src[5] = "   "  # blank on one side: dropped
    val_src, val_tgt = (list(x[:VAL_LINES]) for x in load_multi30k("val", data_dir))
    folder = tmp_path_factory.mktemp("corpus")
    return types.SimpleNamespace(
        train=("train", _write(folder / "train.en.gz", src),
               _write(folder / "train.de.gz", tgt)),
        val=("val", _write(folder / "val.en.gz", val_src),
             _write(folder / "val.de.gz", val_tgt)),
        text={"train": (src, tgt), "val": (val_src, val_tgt)})


def _reference(spm, sources, targets, max_length=MAX_LENGTH):
    """The pairs a prepared split must hold, computed independently:
    blank pairs dropped, source + END, START + target + END, pairs over
    max_length dropped, corpus order."""
    out = []
    for s, t in zip(sources, targets):
        if not (s.strip() and t.strip()):
            continue
        s = tuple(spm.encode(s)) + (END_ID,)
        t = (START_ID,) + tuple(spm.encode(t)) + (END_ID,)
        if len(s) <= max_length and len(t) <= max_length:
            out.append((s, t))
    return out


def _prepare(folder, corpus, spm, corpora=("train", "val"), **kwargs):
    kwargs = {"max_train_length": MAX_LENGTH, "max_file_mib": MAX_FILE_MIB, **kwargs}
    return prepare_translation_data(folder, [getattr(corpus, c) for c in corpora],
                                    spm.encode, spm.size, spm.sha256, **kwargs)


@pytest.fixture(scope="module")
def prepared(corpus, spm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("prepared") / "prepared"
    manifest = _prepare(folder, corpus, spm)
    return types.SimpleNamespace(folder=folder, manifest=manifest,
                                 data=read_prepared(folder, vocabulary_size=spm.size))


@pytest.fixture(scope="module")
def reference(corpus, spm):
    return {name: _reference(spm, *corpus.text[name]) for name in ("train", "val")}


def _pair(split, i):
    return tuple(split.source_ids(i).tolist()), tuple(split.target_ids(i).tolist())


def _rows(batch, tokens=TOKENS, boundaries=BOUNDARIES, num_processes=1):
    """The real rows of one batch as (source, target) id tuples (START +
    target rebuilt from decoder tokens and labels), and the number of
    padding rows; checks dtypes, the exact static shape, the smallest
    bucket, the decoder/labels shift and all-zero padding rows."""
    x, y = batch
    enc, dec, lab = x["encoder_tokens"], x["decoder_tokens"], y
    assert enc.dtype == dec.dtype == lab.dtype == np.int32
    rows, length = enc.shape
    assert length in boundaries and rows == tokens // length
    assert dec.shape == lab.shape == enc.shape
    out, padding = [], 0
    for e, d, l in zip(enc, dec, lab):
        if not e.any():
            assert not d.any() and not l.any()
            padding += 1
            continue
        n_s, n_t = int((e != 0).sum()), int((l != 0).sum())
        # ids are left-aligned, padding only at the end
        assert e[:n_s].all() and not e[n_s:].any()
        assert l[:n_t].all() and not l[n_t:].any() and not d[n_t:].any()
        assert d[0] == START_ID and (d[1:n_t] == l[:n_t - 1]).all()
        assert l[n_t - 1] == END_ID
        s, t = tuple(e[:n_s].tolist()), (START_ID,) + tuple(l[:n_t].tolist())
        assert length == min(b for b in boundaries if b >= max(len(s), len(t) - 1))
        out.append((s, t))
    return out, padding


def _same(a, b):
    (xa, ya), (xb, yb) = a, b
    return (all(np.array_equal(xa[k], xb[k]) for k in ("encoder_tokens", "decoder_tokens"))
            and np.array_equal(ya, yb))


# -- the format -------------------------------------------------------------------


def test_prepared_ids_round_trip_to_the_reference(prepared, reference, corpus, spm):
    for name, lines in (("train", TRAIN_LINES), ("val", VAL_LINES)):
        split, counts = prepared.data.splits[name], prepared.manifest["splits"][name]
        pairs = reference[name]
        assert [_pair(split, i) for i in range(len(split))] == pairs
        assert counts["lines"] == lines and counts["pairs"] == len(pairs) == split.pairs
        assert counts["blank"] == (1 if name == "train" else 0)
        assert counts["too_long"] == lines - counts["blank"] - len(pairs) > 0
        assert counts["source_tokens"] == sum(len(s) for s, _ in pairs)
        assert counts["target_tokens"] == sum(len(t) - 1 for _, t in pairs)
        lengths = [max(len(s), len(t) - 1) for s, t in pairs]
        assert counts["max_pair_length"] == max(lengths)
        assert split.pair_lengths.tolist() == lengths
        assert len(counts["chunks"]) >= 5  # rows cross chunk boundaries
        assert sum(c["pairs"] for c in counts["chunks"]) == len(pairs)
    assert prepared.manifest["reused"] is False
    key = prepared.manifest["key"]
    assert key["vocabulary_sha256"] == spm.sha256 and key["vocabulary_size"] == spm.size
    assert key["max_train_length"] == MAX_LENGTH and key["limit"] == 0


@pytest.mark.parametrize("max_file_mib", [MAX_FILE_MIB, 3 * MAX_FILE_MIB])
def test_chunk_files_never_pass_max_file_mib(corpus, spm, tmp_path, max_file_mib):
    manifest = _prepare(tmp_path / "p", corpus, spm, max_file_mib=max_file_mib)
    limit = max_file_mib * MIB
    folder = tmp_path / "p"
    for name in ("train", "val"):
        chunks = manifest["splits"][name]["chunks"]
        for c in chunks:
            sizes = [(folder / c[k]).stat().st_size
                     for k in ("ids", "offsets", "source_lengths")]
            assert sum(sizes) <= limit
        # the cap is what cuts the chunks: two adjacent chunks would not fit one file
        if len(chunks) > 1:
            first = sum((folder / chunks[0][k]).stat().st_size
                        for k in ("ids", "offsets", "source_lengths"))
            assert first > limit / 2
    listed = {f for s in manifest["splits"].values() for c in s["chunks"]
              for k, f in c.items() if k != "pairs"}
    assert listed == set(manifest["files"]) == {p.name for p in folder.glob("*.npy")}
    with pytest.raises(ValueError, match="max_file_mib"):
        _prepare(tmp_path / "q", corpus, spm, max_file_mib=1e-3)


def test_limit_reads_only_the_first_lines(corpus, spm, tmp_path):
    manifest = _prepare(tmp_path / "p", corpus, spm, corpora=("train",), limit=50)
    split = read_prepared(tmp_path / "p").splits["train"]
    assert manifest["splits"]["train"]["lines"] == 50
    src, tgt = corpus.text["train"]
    assert [_pair(split, i) for i in range(len(split))] == _reference(
        spm, src[:50], tgt[:50])


# -- one epoch -----------------------------------------------------------------------


@pytest.mark.parametrize("tokens", [TOKENS, 100])
def test_one_epoch_holds_every_pair_once_in_static_shapes(prepared, reference, tokens):
    split = prepared.data.splits["train"]
    batches = TokenBatches(split, tokens, BOUNDARIES, seed=3, repeat=False)
    rows, padding, shapes = [], collections.Counter(), collections.Counter()
    short = []
    for i in range(len(batches)):
        batch = batches[i]
        got, pad = _rows(batch, tokens)
        rows += got
        width = batch[1].shape[1]
        padding[width] += pad
        shapes[batch[1].shape] += 1
        short.append(pad > 0)
    assert collections.Counter(rows) == collections.Counter(reference["train"])
    counts = prepared.manifest["splits"]["train"]
    assert sum(len(s) for s, _ in rows) == counts["source_tokens"]
    assert sum(len(t) - 1 for _, t in rows) == counts["target_tokens"]
    # one shape per bucket; only a bucket's last batch is padded
    assert sorted(shapes) == sorted(batches.shapes)
    for (size, width) in shapes:
        assert padding[width] < size
    # the short batches (a bucket's remainder) end the epoch
    assert any(short) and short == sorted(short)
    assert len(batches) == batches.batches_per_epoch == sum(shapes.values())
    with pytest.raises(IndexError):
        batches[len(batches)]


def test_without_shuffle_the_corpus_order_is_kept(prepared, reference):
    split = prepared.data.splits["train"]
    batches = TokenBatches(split, TOKENS, BOUNDARIES, shuffle=False, repeat=False)
    rows = [r for i in range(len(batches)) for r in _rows(batches[i])[0]]
    width = {p: min(b for b in BOUNDARIES if b >= max(len(p[0]), len(p[1]) - 1))
             for p in reference["train"]}
    expected = sorted(reference["train"], key=lambda p: width[p])  # stable: corpus order
    assert rows == expected


def test_the_order_is_a_pure_function_of_seed_and_epoch(prepared):
    split = prepared.data.splits["train"]
    a = TokenBatches(split, TOKENS, BOUNDARIES, seed=7)
    n = a.batches_per_epoch
    first = [a[i] for i in range(2 * n)]
    b = TokenBatches(split, TOKENS, BOUNDARIES, seed=7)  # a restarted process
    assert all(_same(x, b[i]) for i, x in enumerate(first))
    # epochs differ, seeds differ
    assert not all(_same(first[i], first[n + i]) for i in range(n))
    c = TokenBatches(split, TOKENS, BOUNDARIES, seed=8)
    assert not all(_same(first[i], c[i]) for i in range(n))
    # one epoch at a time (repeat=False) gives the same epochs
    d = TokenBatches(split, TOKENS, BOUNDARIES, seed=7, repeat=False)
    for epoch in range(2):
        assert all(_same(d[i], first[epoch * n + i]) for i in range(n))
        d.on_epoch_end()


@pytest.mark.parametrize("epoch,skip", [(0, 3), (1, 0), (1, 5)])
def test_position_resumes_with_exactly_the_uninterrupted_batches(prepared, epoch, skip):
    splits = list(prepared.data.splits.values())
    kwargs = dict(weights=[2, 1], pairs_per_epoch=300, seed=11)
    whole = TokenBatches(splits, TOKENS, BOUNDARIES, **kwargs)
    n = whole.batches_per_epoch
    stream = [whole[i] for i in range(3 * n)]
    position = types.SimpleNamespace(epoch=epoch, skip=skip)
    resumed = TokenBatches(splits, TOKENS, BOUNDARIES, position=position, **kwargs)
    start = epoch * n + skip
    # across the epoch's end into the next one
    for i in range(n + 2):
        assert _same(resumed[i], stream[start + i]), i
    # the position is read when the stream starts again (index 0)
    position.epoch, position.skip = 0, 1
    assert _same(resumed[0], stream[1])


# -- processes ------------------------------------------------------------------------


@pytest.mark.parametrize("num_processes", [2, 3])
def test_processes_split_each_global_batch_into_disjoint_row_blocks(
        prepared, num_processes):
    """Process k's batch j is the k-th block of the global batch j, the
    batch one process with num_processes times the rows gets. Each
    boundary divides TOKENS, so that single process's rows,
    (num_processes * TOKENS) // L, are exactly num_processes * (TOKENS // L)."""
    split = prepared.data.splits["train"]
    workers = [TokenBatches(split, TOKENS, BOUNDARIES, seed=5, repeat=False,
                            num_processes=num_processes, process_index=k)
               for k in range(num_processes)]
    single = TokenBatches(split, num_processes * TOKENS, BOUNDARIES, seed=5,
                          repeat=False)
    assert len(single) == len(workers[0]) == len(workers[-1])
    seen = []
    for j in range(len(single)):
        parts = [w[j] for w in workers]
        widths = {p[1].shape for p in parts}
        assert len(widths) == 1  # every process steps through the same shape
        x = {k: np.concatenate([p[0][k] for p in parts])
             for k in ("encoder_tokens", "decoder_tokens")}
        assert _same((x, np.concatenate([p[1] for p in parts])), single[j])
        for p in parts:
            seen += _rows(p)[0]
    assert collections.Counter(seen) == collections.Counter(
        _pair(split, i) for i in range(len(split)))


# -- mixing ---------------------------------------------------------------------------


@pytest.mark.parametrize("weights,pairs_per_epoch", [([3, 1], 400), ([1, 4], 1000)])
def test_weights_set_each_splits_share_and_the_batch_count_is_fixed(
        prepared, reference, weights, pairs_per_epoch):
    splits = [prepared.data.splits["train"], prepared.data.splits["val"]]
    batches = TokenBatches(splits, TOKENS, BOUNDARIES, weights=weights,
                           pairs_per_epoch=pairs_per_epoch, seed=2)
    n = batches.batches_per_epoch
    share = pairs_per_epoch * np.asarray(weights) / sum(weights)
    known = set(reference["train"]) | set(reference["val"])
    for epoch in range(3):
        buckets, starts, rows = batches.plan(epoch)
        assert len(buckets) == len(starts) == n  # the same count each epoch
        real = rows[rows >= 0]
        drawn = np.bincount(np.searchsorted(batches.bases, real, side="right") - 1,
                            minlength=2)
        # within the rounding of each bucket's stratified share
        assert np.all(np.abs(drawn - share) <= len(BOUNDARIES) / 2), (drawn, share)
        got = []
        for i in range(n):
            got += _rows(batches[epoch * n + i])[0]
        assert len(got) == drawn.sum() and set(got) <= known
    # a split smaller than its share is repeated, a larger one drawn without repeats
    plan = batches.plan(0)[2]
    plan = plan[plan >= 0]
    for i, split in enumerate(splits):
        mine = plan[(plan >= batches.bases[i]) & (plan < batches.bases[i + 1])]
        if len(mine) <= len(split):
            assert len(np.unique(mine)) == len(mine)
        else:
            assert len(np.unique(mine)) == len(split)


# -- reuse ------------------------------------------------------------------------------


def test_reused_only_while_the_key_matches(corpus, spm, tmp_path):
    folder = tmp_path / "p"
    first = _prepare(folder, corpus, spm, corpora=("train",))
    ids_file = folder / first["splits"]["train"]["chunks"][0]["ids"]
    stamp = ids_file.stat().st_mtime_ns
    again = _prepare(folder, corpus, spm, corpora=("train",))
    assert again["reused"] is True and again["key"] == first["key"]
    assert ids_file.stat().st_mtime_ns == stamp
    assert _prepare(folder, corpus, spm, corpora=("train",), reuse=False)["reused"] is False

    changes = {
        "vocabulary": dict(vocabulary=("f" * 64)),
        "max_train_length": dict(max_train_length=24),
        "limit": dict(limit=100),
    }
    for what, change in changes.items():
        m = prepare_translation_data(
            folder, [corpus.train], spm.encode, spm.size,
            change.get("vocabulary", spm.sha256), max_file_mib=MAX_FILE_MIB,
            max_train_length=change.get("max_train_length", MAX_LENGTH),
            limit=change.get("limit", 0))
        assert m["reused"] is False, what
        assert read_prepared(folder, key=m["key"]).manifest["key"] == m["key"]
        assert _prepare(folder, corpus, spm, corpora=("train",))["reused"] is False
    assert read_prepared(folder).manifest["splits"]["train"]["pairs"] == \
        first["splits"]["train"]["pairs"]

    # a corpus file that changed: prepared again, with its new text
    src, tgt = corpus.text["train"]
    changed = tmp_path / "train.en.gz"
    shutil.copy(corpus.train[1], changed)
    m1 = prepare_translation_data(folder, [("train", changed, corpus.train[2])],
                                  spm.encode, spm.size, spm.sha256,
                                  max_train_length=MAX_LENGTH)
    _write(changed, ["A dog ."] + src[1:])
    m2 = prepare_translation_data(folder, [("train", changed, corpus.train[2])],
                                  spm.encode, spm.size, spm.sha256,
                                  max_train_length=MAX_LENGTH)
    assert m2["reused"] is False and m2["key"] != m1["key"]
    split = read_prepared(folder).splits["train"]
    assert _pair(split, 0)[0] == tuple(spm.encode("A dog .")) + (END_ID,)
    # read_prepared refuses a folder made under another key, naming what differs
    with pytest.raises(ValueError, match="max_train_length"):
        read_prepared(folder, key={**m2["key"], "max_train_length": 8})


def test_an_interrupted_preparation_leaves_the_previous_folder(corpus, spm, tmp_path):
    folder = tmp_path / "p"
    first = _prepare(folder, corpus, spm)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    calls = []

    def failing(lines):
        calls.append(len(lines))
        if len(calls) > 2:  # the second chunk of lines
            raise RuntimeError("killed")
        return spm.encode(lines)

    import keras_trm.data.prepared as prepared_module

    old = prepared_module._CHUNK_LINES
    prepared_module._CHUNK_LINES = 100
    try:
        with pytest.raises(RuntimeError, match="killed"):
            prepare_translation_data(folder, [corpus.train, corpus.val], failing,
                                     spm.size, spm.sha256, max_train_length=MAX_LENGTH,
                                     limit=250)
    finally:
        prepared_module._CHUNK_LINES = old
    assert len(calls) == 3
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]  # no staging left
    data = read_prepared(folder, vocabulary_size=spm.size, key=first["key"])
    assert data.splits["train"].pairs == first["splits"]["train"]["pairs"]
    # the next preparation reuses it
    assert _prepare(folder, corpus, spm)["reused"] is True


# -- refusals ---------------------------------------------------------------------------


def _damaged_copy(prepared, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(prepared.folder, folder)
    chunk = prepared.manifest["splits"]["train"]["chunks"][1]
    return folder, chunk


def _rewrite_listed(folder, name, array):
    """Replaces a listed file with ``array`` and updates its manifest entry:
    damage that sizes and SHA-256 cannot see."""
    np.save(folder / name, array, allow_pickle=False)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"][name] = {"bytes": (folder / name).stat().st_size,
                               "sha256": sha256_file(folder / name)}
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_damaged_files_are_refused_naming_the_file(prepared, spm, tmp_path):
    folder, chunk = _damaged_copy(prepared, tmp_path)
    read_prepared(folder, vocabulary_size=spm.size)  # the copy is fine
    ids = folder / chunk["ids"]
    data = ids.read_bytes()

    ids.write_bytes(data[:-8])  # cut short
    with pytest.raises(ValueError, match=chunk["ids"]):
        read_prepared(folder)
    with pytest.raises(ValueError, match=chunk["ids"]):  # unverified: still named
        read_prepared(folder, verify=False)

    flipped = bytearray(data)
    flipped[-3] ^= 0x01
    ids.write_bytes(bytes(flipped))  # same size, one bit
    with pytest.raises(ValueError, match=chunk["ids"]):
        read_prepared(folder)
    ids.write_bytes(data)

    listed = folder / chunk["source_lengths"]
    listed.unlink()
    with pytest.raises(FileNotFoundError, match=chunk["source_lengths"]):
        read_prepared(folder)


def test_a_damaged_manifest_is_refused(prepared, tmp_path):
    folder, chunk = _damaged_copy(prepared, tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    edits = {
        "format": lambda m: {**m, "format": "keras_trm.prepared/0"},
        "files": lambda m: {**m, "files": {**m["files"], chunk["ids"]: {
            **m["files"][chunk["ids"]], "sha256": "0" * 64}}},
        "chunks": lambda m: {**m, "splits": {**m["splits"], "train": {
            **m["splits"]["train"], "chunks": [{"ids": "nothing.npy"}]}}},
        "key": lambda m: {k: v for k, v in m.items() if k != "key"},
    }
    for what, edit in edits.items():
        (folder / MANIFEST).write_text(json.dumps(edit(manifest)))
        with pytest.raises(ValueError) as err:
            read_prepared(folder)
        assert str(folder) in str(err.value), what
        assert (chunk["ids"] if what == "files" else MANIFEST) in str(err.value), what
    (folder / MANIFEST).write_text("{not json")
    with pytest.raises(ValueError, match=MANIFEST):
        read_prepared(folder)
    (folder / MANIFEST).unlink()
    with pytest.raises(FileNotFoundError, match=MANIFEST):
        read_prepared(folder)
    with pytest.raises(NotADirectoryError):
        read_prepared(folder / "train-00000.ids.npy")


def test_ids_past_the_vocabulary_and_bad_offsets_are_refused(prepared, corpus, spm,
                                                             tmp_path):
    folder, chunk = _damaged_copy(prepared, tmp_path)
    ids = np.load(folder / chunk["ids"])
    bad = ids.copy()
    bad[len(bad) // 2] = spm.size
    _rewrite_listed(folder, chunk["ids"], bad)
    with pytest.raises(ValueError, match=rf"{chunk['ids']}.*{spm.size}"):
        read_prepared(folder, vocabulary_size=spm.size)
    _rewrite_listed(folder, chunk["ids"], ids)
    read_prepared(folder, vocabulary_size=spm.size)
    with pytest.raises(ValueError, match="vocabulary"):  # another vocabulary size
        read_prepared(folder, vocabulary_size=spm.size - 1)

    offsets = np.load(folder / chunk["offsets"])
    _rewrite_listed(folder, chunk["offsets"], offsets[:-1])
    with pytest.raises(ValueError, match=chunk["offsets"]):
        read_prepared(folder)

    # encode giving an id past the vocabulary is refused while preparing
    with pytest.raises(ValueError, match="outside the vocabulary"):
        prepare_translation_data(tmp_path / "q", [corpus.train],
                                 lambda lines: [[spm.size + 1] for _ in lines],
                                 spm.size, spm.sha256)
    assert not (tmp_path / "q").exists()


def test_bad_arguments_name_the_argument(prepared, corpus, spm, tmp_path):
    split = prepared.data.splits["train"]
    longest = int(split.pair_lengths.max())
    cases = [
        (TypeError, "splits", lambda: TokenBatches([], TOKENS, BOUNDARIES)),
        (TypeError, "splits", lambda: TokenBatches("train", TOKENS, BOUNDARIES)),
        (TypeError, "tokens_per_batch", lambda: TokenBatches(split, "96", BOUNDARIES)),
        (ValueError, "tokens_per_batch", lambda: TokenBatches(split, 0, BOUNDARIES)),
        (ValueError, "tokens_per_batch", lambda: TokenBatches(split, 16, BOUNDARIES)),
        (TypeError, "boundaries", lambda: TokenBatches(split, TOKENS, "8,32")),
        (ValueError, "boundaries", lambda: TokenBatches(split, TOKENS, ())),
        (ValueError, "boundaries", lambda: TokenBatches(split, TOKENS, (0, 32))),
        (ValueError, "boundaries", lambda: TokenBatches(split, TOKENS, (8, longest - 1))),
        (TypeError, "weights", lambda: TokenBatches(split, TOKENS, BOUNDARIES, weights="1")),
        (ValueError, "weights", lambda: TokenBatches(split, TOKENS, BOUNDARIES,
                                                     weights=[1, 1])),
        (ValueError, "weights", lambda: TokenBatches(split, TOKENS, BOUNDARIES,
                                                     weights=[-1])),
        (ValueError, "weights", lambda: TokenBatches(split, TOKENS, BOUNDARIES,
                                                     weights=[float("nan")])),
        (ValueError, "pairs_per_epoch", lambda: TokenBatches(
            split, TOKENS, BOUNDARIES, pairs_per_epoch=10)),
        (ValueError, "pairs_per_epoch", lambda: TokenBatches(
            split, TOKENS, BOUNDARIES, weights=[1], pairs_per_epoch=0)),
        (ValueError, "seed", lambda: TokenBatches(split, TOKENS, BOUNDARIES, seed=-1)),
        (ValueError, "process_index", lambda: TokenBatches(
            split, TOKENS, BOUNDARIES, num_processes=2, process_index=2)),
        (ValueError, "num_processes", lambda: TokenBatches(
            split, TOKENS, BOUNDARIES, num_processes=0)),
        (ValueError, "max_train_length", lambda: _prepare(tmp_path / "a", corpus, spm,
                                                          max_train_length=1)),
        (TypeError, "max_train_length", lambda: _prepare(tmp_path / "a", corpus, spm,
                                                         max_train_length="32")),
        (ValueError, "limit", lambda: _prepare(tmp_path / "a", corpus, spm, limit=-1)),
        (ValueError, "max_file_mib", lambda: _prepare(tmp_path / "a", corpus, spm,
                                                      max_file_mib=0)),
        (TypeError, "vocabulary_size", lambda: prepare_translation_data(
            tmp_path / "a", [corpus.train], spm.encode, "1000", spm.sha256)),
        (ValueError, "corpora", lambda: prepare_translation_data(
            tmp_path / "a", [corpus.train, corpus.train], spm.encode, spm.size,
            spm.sha256)),
        (ValueError, "corpora", lambda: prepare_translation_data(
            tmp_path / "a", [], spm.encode, spm.size, spm.sha256)),
        (ValueError, "max_pair_length", lambda: bucket_boundaries(0)),
        (ValueError, "boundaries", lambda: parse_boundaries("8,x")),
        (ValueError, "boundaries", lambda: parse_boundaries("8,0")),
    ]
    for error, name, call in cases:
        with pytest.raises(error, match=name):
            call()
    assert not (tmp_path / "a").exists()
    with pytest.raises(FileNotFoundError, match="missing.en"):
        prepare_translation_data(tmp_path / "a", [("x", tmp_path / "missing.en",
                                                   corpus.train[2])],
                                 spm.encode, spm.size, spm.sha256)
    endless = TokenBatches(split, TOKENS, BOUNDARIES)
    with pytest.raises(TypeError, match="repeat"):
        len(endless)
    assert endless.num_batches is None


# -- training ---------------------------------------------------------------------------


def test_fit_on_token_batches_lowers_the_loss(prepared, spm):
    """A tiny Transformer trained a few steps on the batches of real pairs
    (no backend-specific code: the same test under every backend). One
    bucket, so every step has one shape."""
    from keras_trm.models import transformer
    from keras_trm.training import LabelSmoothedCrossEntropy

    split = prepared.data.splits["train"]
    batches = TokenBatches(split, 8 * MAX_LENGTH, (MAX_LENGTH,), seed=0)
    model = transformer(vocabulary_size=spm.size, num_layers=1, d_model=32,
                        num_heads=2, d_ff=64, max_sequence_length=MAX_LENGTH,
                        dropout_rate=0.0)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=LabelSmoothedCrossEntropy(0.0))
    x, y = batches.batch(0, 0)
    loss_before = float(model.evaluate(x, y, verbose=0))
    history = model.fit(batches, epochs=1, steps_per_epoch=30, verbose=0)
    loss_after = float(model.evaluate(x, y, verbose=0))
    assert np.isfinite(history.history["loss"]).all()
    assert loss_before > np.log(spm.size) - 1.0  # about a uniform guess
    assert loss_after < loss_before - 1.5, (loss_before, loss_after)


def test_splits_are_named_as_the_jobs_name_corpora(corpus, spm, tmp_path):
    """The WMT14 corpora are 'europarl_v7_first20000' and
    'newstest2008-2022-pool': a split name is a file-name stem; a path is not."""
    _, source, target = corpus.train
    manifest = prepare_translation_data(
        tmp_path / "p", [("newstest2008-2022-pool", source, target),
                         ("europarl_v7.first", source, target)],
        spm.encode, spm.size, spm.sha256, max_train_length=MAX_LENGTH)
    assert sorted(manifest["splits"]) == ["europarl_v7.first", "newstest2008-2022-pool"]
    for bad in ("a/b", "..", "", ".hidden"):
        with pytest.raises(ValueError, match="corpora"):
            prepare_translation_data(tmp_path / "q", [(bad, source, target)],
                                     spm.encode, spm.size, spm.sha256)
