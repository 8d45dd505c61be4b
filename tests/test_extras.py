"""The core install without its extras: using the server, LiteRT metadata or
the plots raises an ImportError naming the extra; the jobs skip their plots.
A missing package is simulated with ``sys.modules[name] = None`` in a child
process (what ``import`` then raises is ImportError)."""

import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent("""
    import sys
    for name in sys.argv[2].split(","):
        sys.modules[name] = None
    try:
        exec(sys.argv[1])
    except ImportError as err:
        print("ImportError:", err)
""")


def _run(code, missing):
    child = subprocess.run([sys.executable, "-c", _CHILD, code, missing],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    return child.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("code,missing,extra", [
    ("import keras_trm.serving", "flask", "serve"),
    ("import keras_trm.serving", "grpc", "serve"),
    ("from keras_trm.export.warmup import write_warmup_requests\n"
     "write_warmup_requests('/nonexistent/x', [])", "tensorflow_serving", "serve"),
    ("from keras_trm.export.litert import read_litert_metadata\n"
     "read_litert_metadata('/nonexistent/x.tflite')", "ai_edge_litert", "litert"),
    ("from keras_trm.training.plots import plot_lm_curves\n"
     "plot_lm_curves('/nonexistent/x.png', {})", "matplotlib", "plots"),
])
def test_a_missing_extra_is_named(code, missing, extra):
    line = _run(code, missing)
    assert line.startswith("ImportError:"), line
    assert f'pip install "keras_trm[{extra}]"' in line and repr(missing) in line


def test_the_core_imports_without_the_extras():
    code = ("import keras_trm, keras_trm.layers, keras_trm.models, "
            "keras_trm.training, keras_trm.decoding, keras_trm.data, keras_trm.text\n"
            "from keras_trm.jobs import translation\n"
            "from keras_trm.training import plots\n"
            "print('ok', plots.available())")
    assert _run(code, "flask,waitress,grpc,tensorflow_serving,prometheus_client,"
                "ai_edge_litert,matplotlib") == "ok False"


def test_serve_without_the_extra_says_what_to_install(tmp_path):
    child = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['waitress'] = None\n"
         "from keras_trm.cli import main; sys.exit(main(sys.argv[1:]))",
         "serve", "--model_base_path", str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    assert child.returncode == 1
    assert "Traceback" not in child.stderr
    last = child.stderr.strip().splitlines()[-1]
    assert last.startswith("keras-trm serve: error:") and "keras_trm[serve]" in last
