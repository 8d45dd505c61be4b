"""The raw-text SavedModel: fresh-process reload without keras_trm."""

import io
import json
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from keras_trm.decoding import BeamSearch, Translator, search_strategy
from keras_trm.export.saved_model import export_module
from keras_trm.models import transformer
from keras_trm.serving import create_app

SENTENCES = [
    "A man is riding a bike.",
    "",
    "   ",
    "Two dogs " * 200,  # far longer than the model's max_sequence_length
    "A little girl climbing into a wooden playhouse.",
]

FRESH = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    import tensorflow_text  # registers the tokenizer ops
    serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
    sentences = json.loads(sys.stdin.read())
    (out,) = serve(tf.constant(sentences, tf.string)).values()
    assert "keras_trm" not in sys.modules
    print(json.dumps([s.decode("utf-8") for s in out.numpy()]))
""")


def _fresh_process_translations(path, tmp_path):
    """SENTENCES through the SavedModel at ``path``, in a fresh process
    that imports only tensorflow and tensorflow_text."""
    script = tmp_path / "fresh.py"
    script.write_text(FRESH)
    proc = subprocess.run([sys.executable, str(script), str(path)],
                          input=json.dumps(SENTENCES), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def translator(tokenizer):
    model = transformer(tokenizer.vocabulary_size, num_layers=1, d_model=16,
                        num_heads=2, d_ff=32, max_sequence_length=32)
    return Translator(model, tokenizer, search=BeamSearch(beam_size=2))


def test_in_process_edge_cases(translator):
    out = [s.decode() for s in translator.translate(tf.constant(SENTENCES)).numpy()]
    assert out[1] == "" and out[2] == ""           # empty in, empty out
    assert isinstance(out[3], str)                 # truncated, no crash
    assert translator.encode_text(tf.constant(SENTENCES)).shape[1] == 32
    assert translator.translate(tf.constant([], tf.string)).shape == (0,)
    with pytest.raises(ValueError, match="early_stopping='soon'"):
        Translator(translator.model, translator.tokenizer,
                   search=search_strategy(early_stopping="soon"))


def test_saved_model_in_fresh_process_matches(translator, tmp_path):
    path = export_module(translator, tmp_path, "tiny",
                         signatures={"serving_default": translator.translate})
    assert path == tmp_path / "tiny" / "1"
    expected = [s.decode() for s in translator.translate(tf.constant(SENTENCES)).numpy()]
    assert _fresh_process_translations(path, tmp_path) == expected
    # The REST server (TF Serving's API) gives the same translations.
    client = create_app(tmp_path / "tiny").test_client()
    reply = client.post("/v1/models/tiny:predict", json={"instances": SENTENCES})
    assert reply.status_code == 200
    assert reply.get_json() == {"predictions": expected}
    # A second export gets the next version; an existing one is refused.
    assert export_module(translator, tmp_path, "tiny",
                         signatures={"serving_default": translator.translate}).name == "2"
    with pytest.raises(FileExistsError):
        export_module(translator, tmp_path, "tiny", version=1,
                      signatures={"serving_default": translator.translate})


class _BrokenStdin:
    """stdin whose first ``count`` lines arrive, then the read fails."""

    def __init__(self, lines, count):
        self.lines, self.count = lines, count

    def __iter__(self):
        yield from (line + "\n" for line in self.lines[:self.count])
        raise OSError("stdin closed")


def test_translate_command_streams_stdin_a_batch_at_a_time(translator, tmp_path,
                                                           monkeypatch, capsys):
    """``keras-trm translate --model M < file`` read all of stdin into a
    list and translated it in one call (a large file: all of it in memory,
    one search over every sentence). Now each batch is translated and
    printed before the next is read: with ``--batch_size 2``, a read that
    fails at line 4 finds lines 1-2 already printed. A SavedModel that is
    not a translator is named, exit 2."""
    from keras_trm import cli

    path = export_module(translator, tmp_path, "tiny",
                         signatures={"serving_default": translator.translate})
    expected = [s.decode() for s in translator.translate(tf.constant(SENTENCES)).numpy()]
    monkeypatch.setattr(sys, "stdin", _BrokenStdin(SENTENCES, 3))
    with pytest.raises(OSError, match="stdin closed"):
        cli.translate_main(["--model", str(path), "--batch_size", "2"])
    assert capsys.readouterr().out.splitlines() == expected[:2]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(s + "\n" for s in SENTENCES)))
    assert cli.translate_main(["--model", str(path), "--batch_size", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == expected
    assert cli.translate_main(["--model", str(path), *SENTENCES[:2]]) == 0
    assert capsys.readouterr().out.splitlines() == expected[:2]

    class Doubler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def double(self, x):
            return {"y": 2 * x}

    module = Doubler()
    other = export_module(module, tmp_path, "doubler",
                          signatures={"serving_default": module.double})
    with pytest.raises(SystemExit) as exit_info:
        cli.translate_main(["--model", str(other), "A dog."])
    assert exit_info.value.code == 2
    assert "is not a translation SavedModel" in capsys.readouterr().err


@pytest.mark.parametrize("beam_size", [1, 2])
@pytest.mark.slow
def test_xla_translator_and_its_saved_model_match(translator, beam_size,
                                                  tmp_path):
    """``jit_compile=True`` (the search compiled whole by XLA, sources
    padded to a multiple of 8) gives the default translator's strings, edge
    cases included, in process and from its SavedModel in a fresh
    process."""
    plain = Translator(translator.model, translator.tokenizer,
                       search=search_strategy(beam_size=beam_size))
    xla = Translator(translator.model, translator.tokenizer,
                     search=search_strategy(beam_size=beam_size), jit_compile=True)
    expected = [s.decode() for s in plain.translate(tf.constant(SENTENCES)).numpy()]
    got = [s.decode() for s in xla.translate(tf.constant(SENTENCES)).numpy()]
    assert got == expected
    one = [s.decode() for s in xla.translate(tf.constant(SENTENCES[:1])).numpy()]
    assert one == expected[:1]
    assert xla.translate(tf.constant([], tf.string)).shape == (0,)
    with pytest.raises(TypeError, match="jit_compile='yes'"):
        Translator(translator.model, translator.tokenizer, jit_compile="yes")
    path = export_module(xla, tmp_path, "xla",
                         signatures={"serving_default": xla.translate})
    assert _fresh_process_translations(path, tmp_path) == expected


def _xla_compiled_functions(concrete):
    """Names of the functions in ``concrete``'s graph that XLA compiles."""
    library = concrete.graph.as_graph_def().library.function
    return [f.signature.name for f in library
            if f.attr["_XlaMustCompile"].b]


@pytest.mark.slow
def test_xla_for_small_batches_only(translator, tmp_path):
    """``jit_compile_max_batch_size=1``: single sentences run the XLA
    search, larger batches the graph search (a ``tf.cond`` on the batch
    size, with an XLA-compiled function in the graph), with the default
    translator's strings either way, in process and from the SavedModel."""
    # 64 positions: the two searches' output widths differ (below).
    model = transformer(translator.tokenizer.vocabulary_size, num_layers=1,
                        d_model=16, num_heads=2, d_ff=32, max_sequence_length=64)
    plain = Translator(model, translator.tokenizer, search=BeamSearch(beam_size=2))
    hybrid = Translator(model, translator.tokenizer,
                        search=BeamSearch(beam_size=2), jit_compile=True, jit_compile_max_batch_size=1)
    assert not _xla_compiled_functions(plain.translate.get_concrete_function())
    assert _xla_compiled_functions(hybrid.translate.get_concrete_function())
    # The routing itself: a batch of 1 takes the XLA search's padded width
    # (a multiple of 8 source tokens), a batch of 2 the graph search's.
    tokens = tf.constant([[5, 6, 3]], tf.int32)
    assert hybrid.generate_ids(tokens).shape == (1, 8 + 50)
    assert hybrid.generate_ids(tf.tile(tokens, [2, 1])).shape == (2, 3 + 50)
    expected = [s.decode() for s in plain.translate(tf.constant(SENTENCES)).numpy()]
    got = [s.decode() for s in hybrid.translate(tf.constant(SENTENCES)).numpy()]
    one = [hybrid.translate(tf.constant([s]))[0].numpy().decode()
           for s in SENTENCES]
    assert got == expected and one == expected
    with pytest.raises(ValueError, match="jit_compile_max_batch_size=0"):
        Translator(translator.model, translator.tokenizer, jit_compile=True,
                   jit_compile_max_batch_size=0)
    with pytest.raises(ValueError, match="jit_compile_max_batch_size=1 with "
                                         "jit_compile=False"):
        Translator(translator.model, translator.tokenizer,
                   jit_compile_max_batch_size=1)
    path = export_module(hybrid, tmp_path, "hybrid",
                         signatures={"serving_default": hybrid.translate})
    assert _fresh_process_translations(path, tmp_path) == expected


def test_warmup_requests_cover_each_xla_bucket_and_batch_size(translator):
    """``_source_bucket_sentences`` picks the first sentence of each width
    the XLA search is compiled for (read from ``Translator._compiled``'s
    padding itself), every width once, shortest first; the export's
    warm-up requests send each at every batch size up to the limit."""
    from keras_trm.export import translator_warmup_requests
    from keras_trm.export.warmup import _source_bucket_sentences

    hybrid = Translator(translator.model, translator.tokenizer,
                        search=BeamSearch(beam_size=2), jit_compile=True, jit_compile_max_batch_size=1)
    widths = []
    hybrid._compiled_search = lambda tokens: widths.append(int(tokens.shape[1]))

    def compiled_width(sentence):
        widths.clear()
        hybrid._compiled(hybrid.encode_text(tf.constant([sentence])))
        return widths[0]

    # 1 to 39 words (ids + END: 2 to 40, past max_sequence_length 32), blanks skipped.
    sentences = ["", "  "] + [" ".join(["a"] * n) for n in range(39, 0, -1)]
    by_width = {}
    for sentence in sentences[2:]:
        by_width.setdefault(compiled_width(sentence), sentence)
    assert sorted(by_width) == [8, 16, 24, 32]
    assert _source_bucket_sentences(hybrid, sentences) == [
        by_width[w] for w in sorted(by_width)]
    assert _source_bucket_sentences(hybrid, sentences, max_sentences=3) == [
        by_width[32]]
    # The export's requests: every bucket at every batch size XLA runs.
    hybrid3 = Translator(translator.model, translator.tokenizer,
                         search=BeamSearch(beam_size=2), jit_compile=True, jit_compile_max_batch_size=3)
    requests = translator_warmup_requests(hybrid3, sentences)
    assert [(name, inputs["sentences"]) for name, inputs in requests] == [
        ("serving_default", [by_width[w]] * size)
        for size in (1, 2, 3) for w in sorted(by_width)]
    assert translator_warmup_requests(translator, sentences) == []  # graph only


def test_parallel_searches_saved_model_matches(translator, tmp_path):
    """A SavedModel whose search runs in two parts at once serves the
    default translator's strings in a fresh process."""
    expected = [s.decode() for s in translator.translate(tf.constant(SENTENCES)).numpy()]
    split = Translator(translator.model, translator.tokenizer,
                       search=translator.search, parallel_searches=2)
    path = export_module(split, tmp_path, "split",
                         signatures={"serving_default": split.translate})
    assert _fresh_process_translations(path, tmp_path) == expected


def test_failed_export_leaves_nothing(translator, tmp_path):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def broken(x):
        raise RuntimeError("boom")

    with pytest.raises(Exception):
        export_module(translator, tmp_path, "tiny", signatures={"serving_default": broken})
    assert list((tmp_path / "tiny").iterdir()) == []
