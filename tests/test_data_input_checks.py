"""Bad input to keras_trm.data (shards, corpus readers) and keras_trm.text
gets a clear error naming the argument and its value, and loses nothing
(an earlier preparation survives a failed one). Tiny inputs only."""

import gzip
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_trm.data.shards import (
    MANIFEST,
    PAIR_FILES,
    mix_batches,
    mix_steps,
    prepare_shards,
    read_manifest,
    shards_from_pairs,
    stream_batches,
    stream_steps,
)
from keras_trm.data.translation import (
    CorpusError,
    iter_lines,
    load_parallel,
    read_lines,
)
from keras_trm.text import (
    RESERVED_TOKENS,
    TextTokenizer,
    learn_vocabulary,
    lowercase,
    truncate_head_tail,
)

VOCAB = list(RESERVED_TOKENS) + ["a", "b", "c", "dog"]
SOURCES = ["a b", "b c a", "c", "a", "b b"]
TARGETS = ["b", "a c", "c a", "b a", "a"]


@pytest.fixture(scope="module")
def tok():
    return TextTokenizer(VOCAB)


@pytest.fixture(scope="module")
def shards(tok, tmp_path_factory):
    return shards_from_pairs(SOURCES, TARGETS, tok,
                             tmp_path_factory.mktemp("good") / "d",
                             max_train_length=8)


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


# -- TextTokenizer.detokenize: an id past the vocabulary ---------------------


def test_detokenize_of_an_id_past_the_vocabulary_is_an_error_not_a_crash():
    # In a child process: before the fix the detokenize op crashed the
    # interpreter (a segmentation fault), which would take pytest down too.
    code = (
        "import tensorflow as tf\n"
        "from keras_trm.text import TextTokenizer\n"
        f"t = TextTokenizer({VOCAB!r})\n"
        "for ids in (tf.constant([[4, 8]]), tf.ragged.constant([[4], [5, 9]])):\n"
        "    try:\n"
        "        t.detokenize(ids)\n"
        "    except ValueError as e:\n"
        "        print('ERR', e)\n"
        "f = tf.function(lambda x: t.detokenize(x))\n"
        "try:\n"
        "    f(tf.constant([[4, 8]]))\n"
        "except tf.errors.InvalidArgumentError as e:\n"
        "    print('GRAPH', 'vocabulary size 8' in str(e))\n"
        "print('OK', t.detokenize(tf.constant([[4, 7, 3, 99]])).numpy()[0].decode())\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [l for l in done.stdout.splitlines() if l[:3] in ("ERR", "GRA", "OK ")]
    assert lines == [
        "ERR `ids` must be token ids below the vocabulary size 8, got id 8 in row 0",
        "ERR `ids` must be token ids below the vocabulary size 8, got id 9 in row 1",
        "GRAPH True",
        "OK a dog",  # ids after END are not read, so not checked
    ]


# -- keras_trm.text arguments ------------------------------------------------


def test_text_tokenizer_needs_the_reserved_tokens_first():
    with pytest.raises(ValueError, match=r"`vocabulary` must start with .*'a'"):
        TextTokenizer(["a", "[UNK]", "dog", "runs", "x"])
    with pytest.raises(TypeError, match="`vocabulary`"):
        TextTokenizer("[PAD]")


@pytest.mark.parametrize("sentences", [[""], ["  ", ""]])
def test_learn_vocabulary_of_blank_sentences_names_them(sentences):
    with pytest.raises(ValueError, match="`sentences` has no text"):
        learn_vocabulary(sentences, 100)


@pytest.mark.parametrize("size,error", [(None, TypeError), ("100", TypeError),
                                        (5.5, TypeError), (4, ValueError)])
def test_learn_vocabulary_size_must_be_an_int(size, error):
    with pytest.raises(error, match=f"vocabulary_size={size!r}"):
        learn_vocabulary(["a dog runs"], size)


def test_learn_vocabulary_refuses_a_single_string():
    with pytest.raises(TypeError, match="`sentences` must be an iterable of str"):
        learn_vocabulary("a dog runs", 100)
    with pytest.raises(TypeError, match=r"sentences\[1\]=3"):
        learn_vocabulary(["a", 3], 100)


@pytest.mark.parametrize("max_length,error", [(0, ValueError), (-2, ValueError),
                                              (2.5, TypeError)])
def test_truncate_head_tail_needs_a_positive_int(max_length, error):
    ids = tf.ragged.constant([[1, 2, 3], [4]])
    with pytest.raises(error, match=f"max_length={max_length}"):
        truncate_head_tail(ids, max_length)


def test_lowercase_refuses_a_single_string():
    with pytest.raises(TypeError, match="`texts` must be a list of str"):
        lowercase("ABC")
    assert lowercase(["ABC"]) == ["abc"]


# -- corpus readers name the file -------------------------------------------


def _bad_files(tmp_path):
    utf8 = tmp_path / "bad.txt"
    utf8.write_bytes(b"a b\n\xff\xfe\n")
    truncated = tmp_path / "cut.gz"
    truncated.write_bytes(gzip.compress(b"a b\nb\n" * 100)[:-20])
    not_gzip = tmp_path / "plain.gz"
    not_gzip.write_text("a b\nb\n")
    return [(utf8, "not valid UTF-8: line 2"),
            (truncated, "not a readable gzip file"),
            (not_gzip, "not a readable gzip file")]


def test_readers_name_the_file_that_cannot_be_read(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("a b\nb\n")
    for path, what in _bad_files(tmp_path):
        pattern = f"{path.name}' is {what}"
        with pytest.raises(CorpusError, match=pattern):
            read_lines(path)
        with pytest.raises(CorpusError, match=pattern):
            list(iter_lines(path))
        with pytest.raises(CorpusError, match=pattern):
            load_parallel(good, path)


# -- a failed preparation leaves the earlier one ----------------------------


def test_a_failed_re_preparation_keeps_the_old_one(tok, tmp_path):
    folder = tmp_path / "d"
    good = shards_from_pairs(SOURCES, TARGETS, tok, folder, max_train_length=8)
    before = _snapshot(folder)
    with pytest.raises(ValueError, match="no pair of '.*source.txt'"):
        shards_from_pairs(["a b c a b c a b c"], ["a b c a b c a b c"], tok,
                          folder, max_train_length=4)
    assert _snapshot(folder) == before
    assert read_manifest(folder)["key"] == good["key"]
    assert not list(folder.glob(".*"))  # no temporary left
    # The old preparation is still the one the same pairs reuse.
    assert shards_from_pairs(SOURCES, TARGETS, tok, folder,
                             max_train_length=8)["reused"]


def test_a_corrupt_corpus_keeps_the_old_preparation(tok, tmp_path):
    good_en, good_de = tmp_path / "x.en", tmp_path / "x.de"
    good_en.write_text("\n".join(SOURCES) + "\n")
    good_de.write_text("\n".join(TARGETS) + "\n")
    folder = tmp_path / "shards"
    good = prepare_shards(good_en, good_de, tok, folder, max_train_length=8,
                          pairs_per_shard=2)
    before = _snapshot(folder)
    for path, what in _bad_files(tmp_path):
        with pytest.raises(CorpusError, match=f"{path.name}' is {what}"):
            prepare_shards(good_en, path, tok, folder, max_train_length=8,
                           pairs_per_shard=2)
        assert _snapshot(folder) == before
        assert read_manifest(folder)["key"] == good["key"]
        assert not list(folder.glob(".*"))
    # A good new corpus still replaces it, and leaves no old shard behind.
    good_de.write_text("a\n" * len(SOURCES))
    other = prepare_shards(good_en, good_de, tok, folder, max_train_length=8,
                           pairs_per_shard=10)
    assert not other["reused"] and len(other["shards"]) == 1
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST,
                                                        "shard-00000.tfrecord"]


@pytest.mark.parametrize("name,value,error", [
    ("pairs_per_shard", 1.5, TypeError), ("pairs_per_shard", 0, ValueError),
    ("chunk_size", 2.5, TypeError), ("max_train_length", 8.0, TypeError)])
def test_shard_sizes_must_be_ints(tok, tmp_path, name, value, error):
    with pytest.raises(error, match=f"{name}={value!r}"):
        shards_from_pairs(SOURCES, TARGETS, tok, tmp_path / "d",
                          **dict({"max_train_length": 8}, **{name: value}))
    assert not (tmp_path / "d").exists()  # nothing written


def test_pairs_must_be_lists_of_strings_not_one_string(tok, tmp_path):
    for sources, targets, name in (("ab", ["a", "b"], "sources"),
                                   (["a", "b"], "ab", "targets")):
        with pytest.raises(TypeError, match=f"`{name}` must be an iterable of str"):
            shards_from_pairs(sources, targets, tok, tmp_path / "d")
    assert not (tmp_path / "d").exists()


# -- streaming arguments -----------------------------------------------------


@pytest.mark.parametrize("boundaries,error", [
    ((0, 8), ValueError), ((-4, 8), ValueError), ((), ValueError),
    ((4.5, 8), TypeError), (8, TypeError)])
def test_boundaries_are_checked_alike_by_batches_and_steps(shards, boundaries,
                                                           error):
    for call in (stream_batches, stream_steps):
        with pytest.raises(error, match="`boundaries`"):
            call(shards, 8, boundaries)
    with pytest.raises(error, match="`boundaries`"):
        mix_steps([shards], [1], 8, boundaries)


def test_stream_batches_refuses_a_negative_skip_or_epoch(shards):
    with pytest.raises(ValueError, match="skip_batches=-1"):
        stream_batches(shards, 8, (4, 8), skip_batches=-1)
    with pytest.raises(ValueError, match="start_epoch=-1"):
        stream_batches(shards, 8, (4, 8), start_epoch=-1)
    with pytest.raises(TypeError, match="tokens_per_batch=8.5"):
        stream_steps(shards, 8.5, (4, 8))


@pytest.mark.parametrize("pairs", [0, -3, 2.5])
def test_mix_pairs_per_epoch_must_be_a_positive_int(shards, pairs):
    # -3 made repeat=False endless (take(-3)); 0 gave 0 batches silently.
    for call in (lambda: mix_batches([shards], [1], 8, (4, 8), repeat=False,
                                     pairs_per_epoch=pairs),
                 lambda: mix_steps([shards], [1], 8, (4, 8),
                                   pairs_per_epoch=pairs)):
        with pytest.raises((ValueError, TypeError),
                           match=f"pairs_per_epoch={pairs}"):
            call()


@pytest.mark.parametrize("weights", [[float("nan"), 1], [float("inf"), 1],
                                     [-1, 2], [0, 0]])
def test_mix_weights_must_be_finite_non_negative_with_a_positive_sum(shards,
                                                                     weights):
    for call in (mix_batches, mix_steps):
        with pytest.raises(ValueError, match=r"`weights` must be finite .*weights="):
            call([shards, shards], weights, 8, (4, 8))


def test_mix_needs_one_weight_per_corpus(shards):
    for call in (mix_batches, mix_steps):
        with pytest.raises(ValueError, match="2 corpora but 1 weights"):
            call([shards, shards], [1], 8, (4, 8))


def test_lm_vocabulary_decode_and_data_position_are_checked():
    """Vocabulary.decode read id -1 as the last token and raised a bare
    IndexError past the end; DataPosition took a negative epoch."""
    from keras_trm.data.language_modeling import Vocabulary
    from keras_trm.training import DataPosition

    vocab = Vocabulary(["a", "b", "c"])
    assert vocab.decode([2, 0]) == ["c", "a"]
    with pytest.raises(ValueError, match=r"ids.*\[0, 3\).*=-1"):
        vocab.decode([0, -1])
    with pytest.raises(ValueError, match=r"ids.*=5"):
        vocab.decode([5])
    with pytest.raises(TypeError, match="ids"):
        vocab.decode([1.5])
    with pytest.raises(ValueError, match="epoch=-1"):
        DataPosition(epoch=-1)
    with pytest.raises(TypeError, match="skip"):
        DataPosition(skip=2.5)
