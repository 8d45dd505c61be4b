"""Data-directory resolution, Multi30k/WMT14 loaders, WordPiece text."""


import pytest
import tensorflow as tf

from keras_trm.data import ENV_VAR, load_multi30k, load_wmt14, resolve_data_dir
from keras_trm.data import paths as paths_module
from keras_trm.text import RESERVED_TOKENS, load_vocabulary, save_vocabulary

pytestmark = pytest.mark.portable  # CI runs it under each backend


def test_data_dir_order(tmp_path, monkeypatch):
    flag, env = tmp_path / "flag", tmp_path / "env"
    flag.mkdir()
    env.mkdir()
    monkeypatch.setenv(ENV_VAR, str(env))
    assert resolve_data_dir(flag) == flag          # 1. explicit argument
    assert resolve_data_dir() == env               # 2. environment variable
    monkeypatch.delenv(ENV_VAR)
    default = tmp_path / "default"
    default.mkdir()
    monkeypatch.setattr(paths_module, "default_candidates",
                        lambda: (tmp_path / "no", default))
    assert resolve_data_dir() == default           # 3. first existing default


def test_the_working_directory_is_read_at_each_call(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert paths_module.default_candidates()[1] == tmp_path / "data"
    monkeypatch.chdir(tmp_path.parent)
    assert paths_module.default_candidates()[1] == tmp_path.parent / "data"


def test_missing_data_dir_names_the_paths(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        resolve_data_dir(missing)
    monkeypatch.setenv(ENV_VAR, str(missing))
    with pytest.raises(FileNotFoundError, match=f"{ENV_VAR}=.*nowhere"):
        resolve_data_dir()
    monkeypatch.delenv(ENV_VAR)
    monkeypatch.setattr(paths_module, "default_candidates",
                        lambda: (tmp_path / "a", tmp_path / "b"))
    with pytest.raises(FileNotFoundError, match="No data directory found.*/a, .*/b"):
        resolve_data_dir()


def test_multi30k_counts(data_dir):
    for split, n in (("train", 29000), ("val", 1014), ("test_2016_flickr", 1000)):
        src, tgt = load_multi30k(split, data_dir)
        assert len(src) == len(tgt) == n
    src, tgt = load_multi30k("test_2016_flickr", data_dir)
    assert src[0] and tgt[0] and src[0] != tgt[0]


def test_multi30k_missing_files_error(tmp_path):
    with pytest.raises(FileNotFoundError,
                       match=r"expected train\.en\[\.gz\] and train\.de\[\.gz\] in .*multi30k"):
        load_multi30k("train", tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_multi30k("dev", tmp_path)


def test_wmt14_local_test_sets(data_dir):
    src, tgt = load_wmt14("newstest2014", data_dir)
    assert len(src) == len(tgt) == 3003


def test_vocabulary_is_cased_and_reserved(small_vocab, tmp_path):
    assert tuple(small_vocab[:4]) == RESERVED_TOKENS
    assert "Mann" in small_vocab and "Ein" in small_vocab  # cased
    save_vocabulary(small_vocab, tmp_path / "v.txt")
    assert load_vocabulary(tmp_path / "v.txt") == small_vocab
    (tmp_path / "bad.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match="must start with"):
        load_vocabulary(tmp_path / "bad.txt")
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_vocabulary(tmp_path / "nope.txt")


def test_tokenize_detokenize_round_trip(tokenizer, multi30k_small):
    src, tgt = multi30k_small
    sentences = [s for s in src[:100] + tgt[:100] if '"' not in s]
    ids = tokenizer.tokenize(tf.constant(sentences))
    assert ids.dtype == tf.int32
    back = [s.decode() for s in tokenizer.detokenize(ids).numpy()]
    exact = sum(a == b for a, b in zip(back, sentences))
    assert exact / len(sentences) > 0.95, [
        (a, b) for a, b in zip(back, sentences) if a != b][:5]
    # END stops detokenization; reserved ids vanish.
    row = ids[0].numpy().tolist()
    text = tokenizer.detokenize(tf.constant([[2] + row + [3, 5, 6]])).numpy()[0]
    assert text.decode() == back[0]
