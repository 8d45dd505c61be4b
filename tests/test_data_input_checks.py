"""Bad input to keras_trm.data (prepared folders, loader, corpus readers) and keras_trm.text
gets a clear error naming the argument and its value, and loses nothing
(an earlier preparation survives a failed one). Tiny inputs only."""

import gzip
import os
import subprocess
import sys
import types

import pytest
import tensorflow as tf

from keras_trm.data.loader import TokenBatches, bucket_boundaries
from keras_trm.data.prepared import MANIFEST, prepare_translation_data, read_prepared
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

pytestmark = pytest.mark.portable  # CI runs it under each backend

VOCAB = list(RESERVED_TOKENS) + ["a", "b", "c", "dog"]
SOURCES = ["a b", "b c a", "c", "a", "b b"]
TARGETS = ["b", "a c", "c a", "b a", "a"]


@pytest.fixture(scope="module")
def tok():
    return TextTokenizer(VOCAB)


def _encode(lines):
    """Word-level ids of VOCAB (no START/END)."""
    return [[VOCAB.index(w) for w in line.split()] for line in lines]


def _corpus(folder, sources, targets):
    folder.mkdir(parents=True, exist_ok=True)
    en, de = folder / "x.en", folder / "x.de"
    en.write_text("\n".join(sources) + "\n")
    de.write_text("\n".join(targets) + "\n")
    return en, de


def _prepare(folder, en, de, **kwargs):
    kwargs = {"vocabulary_size": len(VOCAB), "max_train_length": 8, **kwargs}
    return prepare_translation_data(folder, [("train", en, de)], _encode,
                                    vocabulary_sha256="0" * 64, **kwargs)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good")
    _prepare(folder / "d", *_corpus(folder, SOURCES, TARGETS))
    return read_prepared(folder / "d").splits["train"]


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


def test_a_failed_re_preparation_keeps_the_old_one(tmp_path):
    en, de = _corpus(tmp_path, SOURCES, TARGETS)
    long_en, long_de = _corpus(tmp_path / "long", ["a b c a b c a b c"] * 2,
                               ["a b c a b c a b c"] * 2)
    folder = tmp_path / "d"
    good = _prepare(folder, en, de)
    before = _snapshot(folder)
    with pytest.raises(ValueError, match="kept no pair: 2 lines, 0 blank, 2 over "
                                         "max_train_length=8"):
        _prepare(folder, long_en, long_de)
    assert _snapshot(folder) == before
    assert read_prepared(folder, key=good["key"]).manifest["key"] == good["key"]
    assert not list(tmp_path.glob(".*"))  # no staging folder left
    # The old preparation is still the one the same corpus reuses.
    assert _prepare(folder, en, de)["reused"]


def test_a_corrupt_corpus_keeps_the_old_preparation(tmp_path):
    good_en, good_de = _corpus(tmp_path, SOURCES, TARGETS)
    folder = tmp_path / "prepared"
    good = _prepare(folder, good_en, good_de)
    before = _snapshot(folder)
    for path, what in _bad_files(tmp_path):
        with pytest.raises(CorpusError, match=f"{path.name}' is {what}"):
            _prepare(folder, good_en, path)
        assert _snapshot(folder) == before
        assert read_prepared(folder).manifest["key"] == good["key"]
        assert not list(tmp_path.glob(".*"))
    # A good new corpus still replaces it, and leaves no old chunk behind.
    good_de.write_text("a\n" * len(SOURCES))
    other = _prepare(folder, good_en, good_de)
    assert not other["reused"] and len(other["splits"]["train"]["chunks"]) == 1
    assert sorted(p.name for p in folder.iterdir()) == [
        MANIFEST, "train-00000.ids.npy", "train-00000.offsets.npy",
        "train-00000.source_lengths.npy"]


@pytest.mark.parametrize("name,value,error", [
    ("max_file_mib", "1", TypeError), ("max_file_mib", 0, ValueError),
    ("limit", 1.5, TypeError), ("limit", -1, ValueError),
    ("max_train_length", 8.0, TypeError), ("max_train_length", 1, ValueError),
    ("vocabulary_size", 7.0, TypeError), ("vocabulary_size", 0, ValueError)])
def test_preparation_sizes_must_be_numbers_in_range(tmp_path, name, value, error):
    en, de = _corpus(tmp_path, SOURCES, TARGETS)
    with pytest.raises(error, match=f"{name}={value!r}"):
        _prepare(tmp_path / "d", en, de, **{name: value})
    assert not (tmp_path / "d").exists()  # nothing written


# -- loader arguments --------------------------------------------------------


@pytest.mark.parametrize("boundaries,error", [
    ((0, 8), ValueError), ((-4, 8), ValueError), ((), ValueError),
    ((4.5, 8), TypeError), (8, TypeError), ("4,8", TypeError)])
def test_boundaries_are_checked(split, boundaries, error):
    with pytest.raises(error, match="`boundaries`"):
        TokenBatches(split, 8, boundaries)
    if boundaries not in ((), 8, "4,8"):
        with pytest.raises(error, match="`boundaries`"):
            bucket_boundaries(8, boundaries)


def test_token_batches_refuse_a_negative_position(split):
    from keras_trm.training import DataPosition

    for epoch, skip, name in ((-1, 0, "position.epoch=-1"), (0, -2, "position.skip=-2")):
        position = types.SimpleNamespace(epoch=epoch, skip=skip)
        with pytest.raises(ValueError, match=name):
            TokenBatches(split, 8, (4, 8), position=position)[0]
    # a DataPosition changed after the loader was made is read at index 0
    position = DataPosition()
    batches = TokenBatches(split, 8, (4, 8), position=position)
    position.skip = -1
    with pytest.raises(ValueError, match="position.skip=-1"):
        batches[0]
    with pytest.raises(TypeError, match="tokens_per_batch=8.5"):
        TokenBatches(split, 8.5, (4, 8))


@pytest.mark.parametrize("pairs", [0, -3, 2.5])
def test_mix_pairs_per_epoch_must_be_a_positive_int(split, pairs):
    # -3 made an epoch endless in the old pipeline; 0 gave 0 batches silently.
    with pytest.raises((ValueError, TypeError), match=f"pairs_per_epoch={pairs}"):
        TokenBatches([split, split], 8, (4, 8), weights=[1, 1], pairs_per_epoch=pairs)


@pytest.mark.parametrize("weights", [[float("nan"), 1], [float("inf"), 1],
                                     [-1, 2], [0, 0]])
def test_mix_weights_must_be_finite_non_negative_with_a_positive_sum(split,
                                                                     weights):
    with pytest.raises(ValueError, match=r"`weights` must be 2 finite .*weights="):
        TokenBatches([split, split], 8, (4, 8), weights=weights)


def test_mix_needs_one_weight_per_corpus(split):
    with pytest.raises(ValueError, match=r"`weights` must be 2 .*one per split.*"
                                         r"weights=\[1\]"):
        TokenBatches([split, split], 8, (4, 8), weights=[1])


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
