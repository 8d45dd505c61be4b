"""SentencePiece on the host (``HostSentencePieceTokenizer``, no
TensorFlow) against the tensorflow-text graph (``SentencePieceTokenizer``)
the exports carry: the same ids and the same text over whole Multi30k
splits, with the vocabulary the translation job learns (joint BPE, 10,000
ids, from Multi30k train)."""

import gzip
import random

import numpy as np
import pytest
import tensorflow as tf

from keras_trm.text import (END_ID, PAD_ID, START_ID, UNK_ID,
                            HostSentencePieceTokenizer, SentencePieceTokenizer,
                            learn_sentencepiece)

pytestmark = pytest.mark.portable  # CI runs it under each backend

# Lines the corpora lack: blank ones, NFKC-changed characters, a character
# outside the vocabulary (byte pieces), tabs, runs of spaces.
ODD_LINES = ["", "   ", "\t", "Ein Ärger: 3½ €!", "ﬁne  double   spaces ",
             "CJK 東京 and emoji 😀", "tab\tseparated", "a\u3000b", " lead"]


def _lines(data_dir, name):
    with gzip.open(data_dir / "multi30k" / name, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


@pytest.fixture(scope="module")
def job_model(data_dir, tmp_path_factory):
    """The translation job's default vocabulary of Multi30k: learned by its
    own ``prepare_tokenizer`` (joint SentencePiece BPE, 10,000 ids)."""
    from keras_trm.jobs.translation import TranslationConfig, prepare_tokenizer

    folder = data_dir / "multi30k"
    workdir = tmp_path_factory.mktemp("spm_job")
    prepare_tokenizer(TranslationConfig(), [
        ("multi30k", folder / "train.en.gz", folder / "train.de.gz")], workdir)
    return workdir / "spm_bpe_10000.model"


@pytest.fixture(scope="module")
def splits(data_dir):
    train = _lines(data_dir, "train.en.gz") + _lines(data_dir, "train.de.gz")
    return {
        **{f"{split}.{lang}": _lines(data_dir, f"{split}.{lang}.gz")
           for split in ("val", "test_2016_flickr") for lang in ("en", "de")},
        "train_slice": random.Random(61).sample(train, 5000),
        "odd": ODD_LINES,
    }


def _graph_ids(graph, lines):
    return graph.tokenize(tf.constant(lines)).to_list()


def test_host_ids_and_text_equal_tf_text_over_whole_splits(job_model, splits):
    host, graph = HostSentencePieceTokenizer(job_model), SentencePieceTokenizer(job_model)
    assert host.vocabulary == graph.vocabulary and len(host.vocabulary) == 10000
    assert host.model_proto == graph.model_proto
    for name, lines in splits.items():
        ids = host.encode(lines)
        assert len(ids) == len(lines)
        assert all(row.dtype == np.int32 and row.ndim == 1 for row in ids)
        graph_ids = graph.tokenize(tf.constant(lines)).to_list()
        different = [i for i, (a, b) in enumerate(zip(ids, graph_ids))
                     if a.tolist() != list(b)]
        assert not different, (name, [lines[i] for i in different[:3]])
        # Text: host detokenize(host ids) == tf-text detokenize(tf-text ids).
        text = host.detokenize(ids)
        graph_text = [t.decode() for t in graph.detokenize(
            tf.ragged.constant(graph_ids, dtype=tf.int32)).numpy()]
        assert text == graph_text, name
        if name != "odd":  # Multi30k is NFKC already: exact round trips
            assert sum(t == s for t, s in zip(text, lines)) >= 0.99 * len(lines), name
    # bytes (what a numpy array of strings holds) tokenize as their text.
    lines = splits["val.de"][:20]
    assert [r.tolist() for r in host.tokenize(np.array([s.encode() for s in lines]))] \
        == [r.tolist() for r in host.encode(lines)]


def test_detokenize_reads_up_to_end_and_drops_reserved_ids_as_tf_text(job_model, splits):
    """Padded search output (START ... END junk PAD): the host reads what
    the graph reads, row by row."""
    host, graph = HostSentencePieceTokenizer(job_model), SentencePieceTokenizer(job_model)
    rows = host.encode(splits["test_2016_flickr.de"][:64])
    rng = np.random.default_rng(0)
    width = max(len(r) for r in rows) + 6
    dense = np.full((len(rows), width), PAD_ID, np.int32)
    for i, row in enumerate(rows):
        junk = rng.integers(4, 10000, size=2)
        full = [START_ID, *row[:3], UNK_ID, *row[3:], END_ID, *junk]
        if i % 4 == 0:
            full = full[:-3]  # no END: the row is read to its end
        dense[i, :len(full)] = full
    expected = [t.decode() for t in graph.detokenize(tf.constant(dense)).numpy()]
    assert host.detokenize(dense) == expected
    assert host.detokenize(list(dense)) == expected  # a list of rows
    assert [len(r) for r in host.content_ids(dense[:1])] == [len(rows[0])]
    assert host.detokenize(np.zeros((0, 3), np.int32)) == []


def test_host_tokenizer_errors(tmp_path, splits):
    import sentencepiece as spm

    lines = splits["train_slice"][:300]
    path = learn_sentencepiece(lines, 400, tmp_path / "sp.model")
    host = HostSentencePieceTokenizer(path, num_threads=1)
    assert host.encode([]) == [] and host.vocabulary_size == 400
    with pytest.raises(TypeError, match="`lines` must be a list of str"):
        host.encode("one line")
    with pytest.raises(TypeError, match=r"lines\[1\]=3"):
        host.encode(["a", 3])
    with pytest.raises(TypeError, match="`sentences` must be a list of str"):
        host.tokenize(b"one line")
    with pytest.raises(ValueError, match="id 400 in row 1"):
        host.detokenize(np.array([[5, 6], [400, END_ID]]))
    host.detokenize(np.array([[5, END_ID, 400]]))  # after END: not read
    with pytest.raises(ValueError, match="2-D"):
        host.detokenize(np.array([5, 6]))
    with pytest.raises(TypeError, match="integer"):
        host.detokenize(np.array([[5.0, 6.0]]))
    with pytest.raises(ValueError, match="num_threads"):
        HostSentencePieceTokenizer(path, num_threads=0)
    with pytest.raises(FileNotFoundError, match="missing.model"):
        HostSentencePieceTokenizer(tmp_path / "missing.model")
    with pytest.raises(TypeError, match="model="):
        HostSentencePieceTokenizer(3)
    # A model of the package's own defaults (0 <unk>, 1 <s>, 2 </s>).
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines),
                                   model_prefix=str(tmp_path / "plain"),
                                   vocab_size=300, minloglevel=2)
    with pytest.raises(ValueError, match="ids 0-3"):
        HostSentencePieceTokenizer(tmp_path / "plain.model")
    # Its bytes load as its path does; in_graph() is the tf-text twin.
    same = HostSentencePieceTokenizer(path.read_bytes())
    assert same.vocabulary == host.vocabulary
    graph = host.in_graph()
    assert isinstance(graph, SentencePieceTokenizer)
    assert _graph_ids(graph, lines[:10]) == [r.tolist() for r in host.encode(lines[:10])]
