"""#38 item 6, "check everything before training": a translation corpus
that cannot be learned from (line counts that differ, no text, invalid
UTF-8) or a vocabulary size too small for its characters stops
``keras-trm train-translation`` at once -- exit 2, one ``error:`` line
naming the file or flag and the value, no traceback -- before a
vocabulary, prepared ids or weights are written."""

import collections
import dataclasses
import gzip
import os
import subprocess
import shutil
import sys

import pytest

from keras_trm.data import CorpusError, check_parallel_corpus
from keras_trm.jobs import translation
from keras_trm.jobs.translation import (
    TranslationConfig,
    check_inputs,
    minimum_vocabulary_size,
)

pytestmark = pytest.mark.portable  # CI runs it under each backend

PROG = "keras-trm train-translation"


def _write(path, data):
    """Writes str or bytes, gzip-compressed for a ``.gz`` name."""
    data = data.encode("utf-8") if isinstance(data, str) else data
    if path.name.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


EN = "A dog runs.\nTwo cats sleep.\nA man rides a bike.\n"
DE = "Ein Hund läuft.\nZwei Katzen schlafen.\nEin Mann fährt Rad.\n"


# --- check_parallel_corpus ---------------------------------------------------------


def test_a_good_corpus_is_counted_in_one_pass(tmp_path):
    src = _write(tmp_path / "t.en", EN + "\n")  # a blank last line
    tgt = _write(tmp_path / "t.de.gz", DE + "\n")
    report = check_parallel_corpus(src, tgt)
    assert report["lines"] == 4 and report["pairs"] == 3
    assert report["characters"] == collections.Counter((EN + DE).replace("\n", ""))
    first = check_parallel_corpus(src, tgt, character_lines=1)["characters"]
    assert first == collections.Counter("A dog runs.Ein Hund läuft.")
    assert check_parallel_corpus(src, tgt, characters=False)["characters"] == {}


def test_unequal_line_counts_name_both_files_and_counts(tmp_path):
    src = _write(tmp_path / "t.en", EN)
    tgt = _write(tmp_path / "t.de.gz", "Ein Hund läuft.\nZwei Katzen schlafen.\n")
    with pytest.raises(CorpusError) as info:
        check_parallel_corpus(src, tgt)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == (
        f"parallel corpus line counts differ: {str(src)!r} has 3 lines but "
        f"{str(tgt)!r} has 2 lines")


@pytest.mark.parametrize("text, words", [
    ("", "has no text: it is empty (0 lines)"),
    ("\n  \n\t\n", "has no text: its 3 lines are all blank"),
])
def test_a_file_without_text_is_named(tmp_path, text, words):
    src = _write(tmp_path / "t.en", text)
    tgt = _write(tmp_path / "t.de", DE)
    with pytest.raises(CorpusError, match="no text") as info:
        check_parallel_corpus(src, tgt)
    assert str(info.value) == f"corpus file {str(src)!r} {words}"


def test_no_line_with_text_on_both_sides_is_an_empty_corpus(tmp_path):
    src = _write(tmp_path / "t.en", "A dog.\n\n")
    tgt = _write(tmp_path / "t.de", "\nEin Hund.\n")
    with pytest.raises(CorpusError, match="parallel corpus is empty: .*t.en.* "
                       r"\(2 lines\) and .*t.de.* \(2 lines\)"):
        check_parallel_corpus(src, tgt)


@pytest.mark.parametrize("name, where", [
    ("t.de", "file"), ("t.de.gz", "decompressed file")])
def test_invalid_utf8_names_file_line_and_byte(tmp_path, name, where):
    src = _write(tmp_path / "t.en", EN)
    # Line 3, its 5th byte: a Latin-1 "ä" (0xe4) where UTF-8 was expected.
    good = "Ein Hund läuft.\nZwei Katzen schlafen.\n".encode("utf-8")
    tgt = _write(tmp_path / name, good + "Ein \xe4Mann fährt Rad.\n".encode(
        "utf-8").replace(b"\xc3\xa4M", b"\xe4M"))
    offset = len(good) + 4
    with pytest.raises(CorpusError) as info:
        check_parallel_corpus(src, tgt)
    assert str(info.value) == (
        f"corpus file {str(tgt)!r} is not valid UTF-8: line 3, byte 5 of the "
        f"line (byte offset {offset} in the {where}): invalid continuation "
        "byte (0xe4)")


def test_damaged_gzip_and_missing_files(tmp_path):
    src = _write(tmp_path / "t.en", EN)
    good = gzip.compress(DE.encode("utf-8"))
    (tmp_path / "cut.de.gz").write_bytes(good[:-12])  # no end-of-stream
    (tmp_path / "plain.de.gz").write_bytes(DE.encode("utf-8"))  # not gzip
    for name in ("cut.de.gz", "plain.de.gz"):
        with pytest.raises(CorpusError, match=f"{name}' is not a readable gzip file"):
            check_parallel_corpus(src, tmp_path / name)
    with pytest.raises(FileNotFoundError, match="nope.de' does not exist"):
        check_parallel_corpus(src, tmp_path / "nope.de")


# --- the vocabulary's minimum size ---------------------------------------------------

TEXT = ["Ein Hund läuft über die Wiese.", "A dog runs across the meadow.",
        "Zwei Katzen (3 Jahre) schlafen!"] * 40


def test_wordpiece_minimum_holds_the_learners_alphabet():
    from keras_trm.text import learn_vocabulary

    minimum, n = minimum_vocabulary_size(
        "wordpiece", collections.Counter("".join(TEXT)))
    alphabet = set("".join(TEXT)) - {" "}
    needed = alphabet | {"##" + c for c in alphabet}
    assert n == len(alphabet) and minimum == 4 + len(needed)
    # Unconstrained, the learner keeps every character in both forms ...
    assert needed <= set(learn_vocabulary(TEXT, 1000))
    # ... below the minimum some are necessarily cut ([UNK] in training).
    assert not needed <= set(learn_vocabulary(TEXT, minimum - 1))


def test_sentencepiece_minimum_is_where_the_learner_stops_raising(tmp_path):
    from keras_trm.text import learn_sentencepiece

    minimum, n = minimum_vocabulary_size(
        "sentencepiece_bpe", collections.Counter("".join(TEXT)))
    assert n == len(set("".join(TEXT))) and minimum == 260 + n  # " " is "▁"
    learn_sentencepiece(TEXT, minimum, tmp_path / "ok.model")
    with pytest.raises(RuntimeError, match=f"{minimum - 1} vs {minimum}"):
        learn_sentencepiece(TEXT, minimum - 1, tmp_path / "small.model")
    assert not (tmp_path / "small.model").exists()


def _files_config(tmp_path, **fields):
    src = _write(tmp_path / "train.en", "\n".join(TEXT[:3]) + "\n")
    tgt = _write(tmp_path / "train.de.gz", "\n".join(TEXT[:3]) + "\n")
    return TranslationConfig(
        dataset="files", train_source=str(src), train_target=str(tgt),
        validation_source=str(src), validation_target=str(tgt), **fields)


def test_check_inputs_names_the_flag_both_values_and_the_limit(tmp_path):
    config = _files_config(tmp_path, vocabulary="wordpiece", vocabulary_size=30)
    minimum, n = minimum_vocabulary_size(
        "wordpiece", collections.Counter("".join(TEXT[:3]) * 2))
    with pytest.raises(CorpusError) as info:
        check_inputs(config)
    assert str(info.value) == (
        f"`vocabulary_size` (--vocabulary_size) must be at least {minimum} for "
        f"a wordpiece vocabulary of the training corpus 'train': 4 reserved "
        f"tokens + 2 x {n} distinct characters, each as a word and as a "
        "##continuation; got vocabulary_size=30")
    # A smoke run learns from its first `limit` lines: they decide.
    first, _ = minimum_vocabulary_size("wordpiece", collections.Counter(TEXT[0]))
    assert first < minimum
    limited = dataclasses.replace(config, limit=1, vocabulary_size=first)
    assert check_inputs(limited) == {
        "corpora": {"train": {"lines": 3, "pairs": 3}},
        "minimum_vocabulary_size": first}
    with pytest.raises(CorpusError,
                       match=fr"at least {first} .*'train' \(first 1 lines\)"):
        check_inputs(dataclasses.replace(limited, vocabulary_size=first - 1))


def test_check_inputs_reads_validation_and_test_files_too(tmp_path):
    config = _files_config(tmp_path)
    bad = _write(tmp_path / "test.de", b"Ein Hund\xff.\n")
    with pytest.raises(CorpusError, match="test.de' is not valid UTF-8: line 1"):
        check_inputs(dataclasses.replace(
            config, test_source=config.train_source, test_target=str(bad)))
    with pytest.raises(CorpusError, match="needs both --test-source and --test-target"):
        check_inputs(dataclasses.replace(config, test_source=config.train_source))


def test_run_stops_before_the_run_folder_exists(tmp_path):
    config = _files_config(tmp_path, vocabulary_size=100)  # SentencePiece BPE
    with pytest.raises(CorpusError, match="vocabulary_size=100"):
        translation.run(config, None, tmp_path / "run", tmp_path / "export")
    assert not (tmp_path / "run").exists() and not (tmp_path / "export").exists()


def test_multi30k_train_is_counted_and_needs_less_than_the_default_vocabulary(
        data_dir):
    # What it costs (about 0.13 s for train on 2 cores) is not a test's
    # business (docs/long-runs.md has the figure).
    result = check_inputs(TranslationConfig(), data_dir)
    assert result["corpora"]["train"] == {"lines": 29000, "pairs": 29000}
    assert result["minimum_vocabulary_size"] < TranslationConfig().vocabulary_size


# --- the command line -----------------------------------------------------------------


def _cases(tmp_path):
    """(flags, words the error line must hold) per case (a)-(d)."""
    en = _write(tmp_path / "train.en", EN)
    de = _write(tmp_path / "train.de.gz", DE)
    short = _write(tmp_path / "short.de", "Ein Hund läuft.\n")
    blank = _write(tmp_path / "blank.en", "\n\n\n")
    bad = _write(tmp_path / "bad.de", DE.encode("utf-8").replace(b"Zwei", b"Zw\xffi"))
    return {
        "unequal_lines": ([en, short], [str(en), "3 lines", str(short), "1 lines"]),
        "empty": ([blank, de], [str(blank), "has no text", "3 lines are all blank"]),
        "invalid_utf8": ([en, bad], [str(bad), "not valid UTF-8", "line 2",
                                     "byte 3 of the line", "byte offset 19"]),
        "vocabulary_size": ([en, de, "--vocabulary_size", "100"],
                            ["--vocabulary_size", "vocabulary_size=100",
                             "at least 2"]),
    }


@pytest.mark.parametrize("case", ["unequal_lines", "empty", "invalid_utf8",
                                  "vocabulary_size"])
def test_cli_refuses_a_bad_corpus_with_one_usage_error(tmp_path, case):
    (source, target, *flags), words = _cases(tmp_path)[case]
    workdir, export = tmp_path / "run", tmp_path / "export"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run(
        [sys.executable, "-m", "keras_trm.cli", "train-translation",
         "--dataset", "files", "--train-source", str(source),
         "--train-target", str(target), "--validation-source", str(source),
         "--validation-target", str(target), "--download", "false",
         "--preset", "tiny", "--epochs", "1", "--time-budget-minutes", "0.1",
         "--data-dir", str(tmp_path), "--workdir", str(workdir),
         "--export-dir", str(export), *flags],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    # The usage error of every bad flag (jsonargparse's: usage, a tip, then
    # "error: <message>"), its message on one line.
    assert len(errors) == 1 and errors[0].startswith("error: "), errors
    assert f"usage: {PROG}" in proc.stderr
    for word in words:
        assert word in errors[0], (word, errors[0])
    # The resolved config is kept (to run it again, fixed, with --config);
    # nothing learned or trained is.
    assert sorted(p.name for p in workdir.iterdir()) == ["config.yaml"]
    assert not export.exists()


def test_check_inputs_reads_multi30k_val_and_test_and_names_missing_files(
        data_dir, tmp_path):
    """Multi30k's val and test_2016_flickr are checked too: a damaged test
    file, or a missing one (``--download false``), stops the job before
    anything is written, as a ``CorpusError`` naming the file."""
    local = tmp_path / "data" / "multi30k"
    local.mkdir(parents=True)
    for path in (data_dir / "multi30k").glob("*.gz"):
        shutil.copy(path, local / path.name)
    config = TranslationConfig(download=False)
    assert check_inputs(config, tmp_path / "data")["corpora"]["train"]["pairs"] == 29000
    lines = gzip.decompress((local / "test_2016_flickr.de.gz").read_bytes())
    (local / "test_2016_flickr.de.gz").write_bytes(gzip.compress(
        lines.replace(b"\n", b"\n\xff", 1)))  # line 2 gets a bad byte
    with pytest.raises(CorpusError, match=r"test_2016_flickr\.de\.gz' is not "
                                          r"valid UTF-8: line 2, byte 1"):
        check_inputs(config, tmp_path / "data")
    (local / "val.en.gz").unlink()
    with pytest.raises(CorpusError, match=r"Multi30k split 'val' not found: "
                                          r"expected val\.en\[\.gz\]"):
        check_inputs(config, tmp_path / "data")
