"""A quiet start (issue #62): ``keras-trm``'s first screen has no
TensorFlow C++ log line unless the user set ``TF_CPP_MIN_LOG_LEVEL``, and
``--help`` does not import TensorFlow."""

import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# TensorFlow's C++ log lines: absl's format (I0000 00:00:...), its notice,
# and the start-up messages by name.
TF_LOG_LINE = re.compile(
    r"^[IWEF]\d{4} |absl::InitializeLog|cpu_feature_guard|oneDNN|cudart_stub",
    re.MULTILINE)


def _env(**extra):
    """This checkout's keras_trm, TF_CPP_MIN_LOG_LEVEL unset (.ci/run sets it)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env.update(extra)
    return env


def _imports(stderr):
    """The modules ``python -X importtime`` reports as imported."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


@pytest.mark.parametrize("command", [
    [], ["train-translation"], ["export-translation"], ["serve"], ["translate"],
    ["sample-lm"], ["train-lm"], ["export-lm"]])
def test_help_imports_no_tensorflow(command):
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "keras_trm.cli", *command, "--help"],
        capture_output=True, text=True, env=_env(), cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage: keras-trm" in proc.stdout
    imported = _imports(proc.stderr)
    assert "keras_trm._runtime" in imported  # the report is there
    assert not imported & {"tensorflow", "keras", "jax", "torch"}
    assert not TF_LOG_LINE.search(proc.stderr), proc.stderr[-2000:]


def test_console_script_help_is_quiet():
    """``keras-trm`` itself (argv[0] names the command: keras_trm/__init__.py
    leaves TensorFlow to the command)."""
    script = pathlib.Path(sys.executable).parent / "keras-trm"  # pip's script
    if not script.is_file():
        pytest.skip("keras-trm is not installed beside this Python")
    script = str(script)
    check = ("import runpy, sys; sys.argv = [{script!r}, 'train-translation', '--help']; "
             "code = 0\ntry:\n    runpy.run_path({script!r}, run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\n"
             "print('tensorflow' in sys.modules, code, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", check.format(script=script)],
                          capture_output=True, text=True, env=_env(), cwd=REPO,
                          timeout=120)
    assert "--data.dataset" in proc.stdout, proc.stderr[-2000:]
    assert proc.stderr.split() == ["False", "0"], proc.stderr[-2000:]


@pytest.mark.parametrize("recipe", [
    "translate_multi30k", "translate_wmt14", "language_model", "imdb", "mnist"])
def test_recipe_help_is_quiet(recipe):
    """A recipe script starts as ``keras-trm`` does (``cli.run_recipe``)."""
    proc = subprocess.run([sys.executable, f"recipes/{recipe}.py", "--help"],
                          capture_output=True, text=True, env=_env(), cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"usage: recipes/{recipe}.py" in proc.stdout
    assert not TF_LOG_LINE.search(proc.stderr), proc.stderr[-2000:]


def _corpus(folder, n=60):
    words = ("a man woman dog cat red blue runs sits on the in snow water big "
             "small child plays").split()
    pairs = [" ".join(words[(i * k) % len(words)] for k in (1, 3, 5, 7))
             for i in range(n)]
    for lang, suffix in (("en", ""), ("de", " ja")):
        (folder / f"c.{lang}").write_text("".join(p + suffix + "\n" for p in pairs))
    return folder / "c.en", folder / "c.de"


def test_training_command_first_screen_has_no_tensorflow_log_line(tmp_path):
    """A real (tiny) train-translation, read until its model is built
    (TensorFlow imported, devices listed, a vocabulary learned, shards
    written: where TensorFlow 2.21 logged 4 start-up blocks and a oneDNN
    DT_INT64 error), then stopped."""
    source, target = _corpus(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "keras_trm.cli", "train-translation",
         "--dataset", "files", "--train-source", str(source),
         "--train-target", str(target), "--validation-source", str(source),
         "--validation-target", str(target), "--download", "false",
         "--preset", "tiny", "--vocabulary", "wordpiece", "--vocabulary-size", "100",
         "--epochs", "1",
         "--data-dir", str(tmp_path), "--workdir", str(tmp_path / "run"),
         "--export-dir", str(tmp_path / "export")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_env(), cwd=tmp_path)
    lines = []
    deadline = time.monotonic() + 400
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("model: ") or time.monotonic() > deadline:
                break
    finally:
        proc.kill()
        proc.wait()
    screen = "".join(lines)
    assert lines and lines[0].startswith("config: "), screen[-3000:]
    assert any(line.startswith("model: ") for line in lines), screen[-3000:]
    assert not TF_LOG_LINE.search(screen), screen


QUIET_IMPORT = """
import sys
sys.argv = ["keras-trm"]
from keras_trm._runtime import quiet_tensorflow_start
print(quiet_tensorflow_start())
import warnings
import tensorflow
warnings.warn("a Python warning")
"""


def test_quiet_start_keeps_python_warnings_and_the_users_level():
    quiet = subprocess.run([sys.executable, "-c", QUIET_IMPORT], capture_output=True,
                           text=True, env=_env(), timeout=300)
    assert quiet.returncode == 0 and quiet.stdout.strip() == "True", quiet.stderr
    assert not TF_LOG_LINE.search(quiet.stderr), quiet.stderr
    assert "UserWarning: a Python warning" in quiet.stderr
    # TF_CPP_MIN_LOG_LEVEL set by the user: left alone, TensorFlow logs.
    user = subprocess.run([sys.executable, "-c", QUIET_IMPORT], capture_output=True,
                          text=True, env=_env(TF_CPP_MIN_LOG_LEVEL="0"), timeout=300)
    assert user.returncode == 0 and user.stdout.strip() == "False", user.stderr
    assert TF_LOG_LINE.search(user.stderr), user.stderr


def test_importing_the_library_changes_no_environment_variable():
    # TensorFlow itself sets some (TF2_BEHAVIOR, TF_CPP_MIN_LOG_LEVEL=1, ...).
    check = ("import os, sys, keras, tensorflow; before = dict(os.environ); "
             "import keras_trm; "
             "print(dict(os.environ) == before, 'keras_trm.training' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True,
                          text=True, env=_env(), timeout=300)
    assert proc.stdout.split() == ["True", "True"], proc.stderr[-2000:]
