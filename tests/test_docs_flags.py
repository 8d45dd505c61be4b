"""Every command line written in README.md, export/README.md and
docs/**/*.md parses.

A command line is ``keras-trm <command> ...`` or ``python recipes/<name>.py
...`` inside a fenced code block (a trailing backslash continues the line)
or an inline code span. Each ``--flag`` after it, up to the end of the
command (``&&``, ``|``, ``;``, ``#``, a redirection), must be the spelling
that ``<command> --help`` shows: the first name of one of the options of
that command's parser (``--data.train_source``, not the ``--train-source``
that the parser also accepts). The parsers are the ones the commands build:
each command's function is called with ``--help`` and stopped where it
parses.

The generated run reports under ``docs/results/`` are left out: each
records the command line of its run as it was typed.
"""

import argparse
import importlib.util
import pathlib
import re

import pytest

from keras_trm import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = ["README.md", "export/README.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")
    if "results" not in p.relative_to(ROOT / "docs").parts)]

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_SPAN = re.compile(r"`((?:[^`\n]|\n(?!\n))+)`")  # within a paragraph
_COMMAND = re.compile(r"keras-trm\s+(<[^>]*>|[a-z][\w-]*)|recipes/(\w+)\.py")
_END = re.compile(r"&&|\|\||[|;#<>]")
_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][\w.-]*)")


def command_lines(text):
    """``(command, rest)`` for each command line in ``text``: ``command``
    is ``keras-trm <command>`` or ``recipes/<name>.py``, ``rest`` what
    follows it up to the end of the command."""
    pieces = []
    for block in _FENCE.finditer(text):
        pieces += block.group(0).replace("\\\n", " ").splitlines()[1:-1]
    pieces += [span.replace("\n", " ") for span in _SPAN.findall(_FENCE.sub("", text))]
    for piece in pieces:
        found = list(_COMMAND.finditer(piece))
        for this, after in zip(found, found[1:] + [None]):
            rest = piece[this.end():after.start() if after else None]
            end = _END.search(rest)
            name = (f"keras-trm {this.group(1)}" if this.group(1)
                    else f"recipes/{this.group(2)}.py")
            yield name, rest[:end.start()] if end else rest


class _Parsed(Exception):
    def __init__(self, parser):
        self.parser = parser


def _entry_point(command):
    """The function behind ``command`` (``keras-trm train-lm``,
    ``recipes/mnist.py``), or None where there is none."""
    if command.startswith("keras-trm "):
        return cli.COMMANDS.get(command.split()[1])
    path = ROOT / command
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a recipe runs only under __main__
    if hasattr(module, "main"):
        return module.main
    # The recipes that only pass their prog to a keras-trm command
    # (``run_recipe(train_lm_main, prog=...)``).
    called = re.search(r"\brun_recipe\((train_\w+_main)\b", path.read_text(encoding="utf-8"))
    if not called:
        return None
    function = getattr(cli, called.group(1))
    return lambda argv: function(argv, prog=command)


_FLAGS = {}


def help_flags(command, monkeypatch):
    """The option names that ``command --help`` shows (the first name of
    each option of the parser the command builds)."""
    if command not in _FLAGS:
        function = _entry_point(command)
        assert function is not None, f"{command}: no such command"
        import jsonargparse

        def stop(self, *args, **kwargs):
            raise _Parsed(self)

        with monkeypatch.context() as patch:
            patch.setattr(argparse.ArgumentParser, "parse_args", stop)
            patch.setattr(jsonargparse.ArgumentParser, "parse_args", stop)
            with pytest.raises(_Parsed) as parsed:
                function(["--help"])
        names = {"--help"}
        for action in parsed.value.parser._actions:
            names.update(action.option_strings[:1])
        _FLAGS[command] = names
    return _FLAGS[command]


def test_command_lines_are_found():
    """The reader finds commands in blocks, continued lines and spans, and
    stops at the end of each command."""
    text = ("Run `keras-trm train-lm --corpus ptb` and then\n\n"
            "```bash\nKERAS_BACKEND=jax keras-trm train-translation \\\n"
            "    --data.dataset files --seed 1 && keras-trm serve --port 1 # --no\n"
            "python recipes/mnist.py --norms layer > log.txt\n```\n")
    found = [(name, _FLAG.findall(rest)) for name, rest in command_lines(text)]
    assert sorted(found) == sorted([
        ("keras-trm train-lm", ["--corpus"]),
        ("keras-trm train-translation", ["--data.dataset", "--seed"]),
        ("keras-trm serve", ["--port"]),
        ("recipes/mnist.py", ["--norms"]),
    ])


def test_help_flags_are_the_parsers_first_names(monkeypatch):
    flags = help_flags("keras-trm train-translation", monkeypatch)
    assert {"--data.train_source", "--training.time_budget_minutes",
            "--preset", "--help"} <= flags
    # Accepted by the parser, but not the spelling --help shows.
    assert not {"--train-source", "--train_source", "--time-budget-minutes"} & flags
    serve = help_flags("keras-trm serve", monkeypatch)
    assert "--model_base_path" in serve and "--model-base-path" not in serve


@pytest.mark.parametrize("page", PAGES)
def test_documented_flags_are_the_help_spelling(page, monkeypatch):
    text = (ROOT / page).read_text(encoding="utf-8")
    problems = []
    for command, rest in command_lines(text):
        if command.startswith("keras-trm <"):
            continue  # keras-trm <command> --help: any command
        for flag in _FLAG.findall(rest):
            if flag not in help_flags(command, monkeypatch):
                problems.append(f"{command} {flag}")
    assert not problems, (
        f"{page}: not a flag that --help shows: " + ", ".join(problems))


def test_readme_lists_every_command():
    """``keras-trm --help`` lists ``cli.COMMANDS``; the README names each
    as ``keras-trm <command>``."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = {name for name, _ in command_lines(readme)}
    assert f"  {'train-translation':<19}" in cli.usage()
    missing = [c for c in cli.COMMANDS if f"keras-trm {c}" not in named]
    assert not missing, f"README.md does not show: {missing}"


def test_export_readme_describes_the_default_export():
    """export/README.md describes what ``keras-trm train-translation``
    exports with its defaults, and its links lead to files."""
    from keras_trm.jobs.translation import TranslationConfig, vocabulary_kind

    config = TranslationConfig()
    text = (ROOT / "export/README.md").read_text(encoding="utf-8")
    entry = text.split(f"- `{config.model_name}/<version>/`", 1)[1].split("\n- ", 1)[0]
    assert vocabulary_kind(config) == "sentencepiece_bpe"
    assert "SentencePiece BPE" in entry and "WordPiece" not in entry
    assert f"{config.vocabulary_size:,}-id" in entry
    assert f"beam {config.beam_size}, α = {config.length_penalty:g}" in entry
    assert f"{config.max_sequence_length} positions" in entry
    for link in re.findall(r"\]\(([^)#]+)", text):
        assert (ROOT / "export" / link).exists(), link
