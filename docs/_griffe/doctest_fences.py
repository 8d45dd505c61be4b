"""Griffe extension for the API reference: doctest examples as code blocks.

The package's docstrings keep their ``Example:`` blocks at the docstring's
own indentation (``tests/test_doctests.py`` runs them). Markdown would read
a ``>>>`` line as a nested block quote and ``x[0]`` as a link, so each run
of lines that starts with ``>>>`` (up to the next blank line) is wrapped in
a ``pycon`` fence before mkdocstrings renders it. The source is unchanged.
"""

import griffe


def fence_doctests(text):
    """Wraps each ``>>>`` run of ``text`` in a ```` ```pycon ```` fence."""
    lines = text.split("\n")
    out = []
    in_fence = False
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if not in_fence and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i])
                i += 1
            if out and out[-1].strip():
                out.append("")
            out.extend([indent + "```pycon", *block, indent + "```"])
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Applies ``fence_doctests`` to every docstring griffe loads."""

    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
