"""The figures in README.md and docs/*.md are the ones the JSON files hold.

A results table is a Markdown table that has a ``source`` column. In each
row the source cell names a JSON file (a code span ending in ``.json``,
relative to the repository root) followed by one key path per figure, for
example `` `bench/results/serving.json` `configs.batching.load.sentences_per_s` ``.
Key paths are dotted, with ``[i]`` for list items. A key path followed by
``×100`` is scaled by 100 (fractions printed as percentages). A later
``.json`` span switches the file for the key paths after it.

The ``value`` cell holds the figures and nothing else with digits (labels
such as "bf16" or "p50" belong in the first column). Its i-th number must
equal the i-th key's value rounded as printed: ``37.84`` matches
37.8400..37.8449, ``88.07%`` matches ``0.88072 ×100``. Where the JSON
records a date (on the key's path or at the top level), the row's ``date``
must be that date; where it names the CPU (AMD EPYC, Xeon), the row's
``host`` must name it too.

The README's tables have an ``id`` column instead of the source: each id
is a row of the table in ``docs/measurements.md`` that has both an ``id``
and a ``source`` column, and the README row's figures, date and host are
checked against that row's source as above (and its split must be that
row's split).
"""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Pages whose figures come from JSON; each must hold at least one results
# table (so that dropping the source column cannot silently skip a page).
# README.md's figures are checked through docs/measurements.md (check_readme).
PAGES = [
    "docs/measurements.md",
    "docs/recipes/multi30k.md",
    "docs/recipes/wmt14.md",
    "docs/recipes/imdb.md",
    "docs/recipes/mnist.md",
    "docs/recipes/language-model.md",
    "docs/serving.md",
    "docs/export.md",
    "docs/long-runs.md",
]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_SPAN = re.compile(r"`([^`]+)`(\s*×\s*100)?")
_KEY = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def results_tables(text, columns=("source",)):
    """Yields ``(line_number, {column: cell})`` for each row of each table
    whose header has all of ``columns`` (by default a ``source`` column)."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if (line.lstrip().startswith("|") and i + 1 < len(lines)
                and re.fullmatch(r"\s*\|?[\s:|-]+\|?\s*", lines[i + 1])
                and "-" in lines[i + 1]):
            header = [c.lower() for c in _cells(line)]
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                if set(columns) <= set(header):
                    cells = _cells(lines[i])
                    yield i + 1, dict(zip(header, cells))
                i += 1
            continue
        i += 1


def resolve(data, key_path):
    """``data`` at ``key_path`` ("a.b[2].c"); KeyError naming the path."""
    value = data
    for name, index in _KEY.findall(key_path):
        try:
            value = value[int(index)] if index else value[name]
        except (KeyError, IndexError, TypeError):
            raise KeyError(f"no {key_path!r} ({name or index!r} missing)")
    return value


def _context(data, key_path, names):
    """Strings under ``names`` on the key's path, nearest first, then at the
    top level."""
    found = []
    value = data
    stack = [data]
    for name, index in _KEY.findall(key_path):
        try:
            value = value[int(index)] if index else value[name]
        except (KeyError, IndexError, TypeError):
            break
        stack.append(value)
    for node in reversed(stack):
        if isinstance(node, dict):
            for name in names:
                item = node.get(name)
                if isinstance(item, str):
                    found.append(item)
                elif isinstance(item, dict):
                    found.extend(v for k, v in item.items()
                                 if isinstance(v, str) and "cpu" in k)
    return found


def check_row(row, root=ROOT):
    """Problems with one results-table row (an empty list when it agrees)."""
    problems = []
    value_cell = row.get("value", "")
    printed = _NUMBER.findall(value_cell)
    sources = []  # (file, key path, scale)
    current = None
    for span, times_100 in _SPAN.findall(row.get("source", "")):
        if span.endswith(".json"):
            current = span
            continue
        if current is None:
            problems.append(f"key {span!r} comes before any .json file")
            continue
        sources.append((current, span, 100 if times_100 else 1))
    if not sources:
        return problems + [f"no key path in source cell {row.get('source')!r}"]
    if len(printed) != len(sources):
        return problems + [
            f"value {value_cell!r} has {len(printed)} numbers but the source "
            f"names {len(sources)} keys"]
    loaded = {}
    for text, (file, key, scale) in zip(printed, sources):
        path = root / file
        if file not in loaded:
            try:
                loaded[file] = json.loads(path.read_text(encoding="utf-8"))
            except OSError as err:
                problems.append(f"{file}: {err}")
                continue
        data = loaded[file]
        try:
            value = resolve(data, key)
        except KeyError as err:
            problems.append(f"{file}: {err.args[0]}")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{file} {key} is {value!r}, not a number")
            continue
        shown = float(text.replace(",", ""))
        decimals = len(text.split(".")[1]) if "." in text else 0
        if abs(value * scale - shown) > 0.5 * 10 ** -decimals + 1e-9:
            problems.append(
                f"{text} disagrees with {file} {key} = {value}"
                + (" ×100" if scale != 1 else ""))
            continue
        date = row.get("date")
        for recorded in _context(data, key, ("date",))[:1]:
            if date is not None and not recorded.startswith(date):
                problems.append(
                    f"date {date!r} but {file} records {recorded!r}")
        host = row.get("host")
        if host is not None:
            for recorded in _context(data, key, ("host", "cpu", "machine")):
                for cpu in ("EPYC", "Xeon"):
                    if cpu in recorded and cpu not in host:
                        problems.append(
                            f"host {host!r} but {file} records {recorded!r}")
    return sorted(set(problems))


def check_text(text, root=ROOT):
    """``(rows checked, problems)`` for every results table of ``text``."""
    problems, rows = [], 0
    for line, row in results_tables(text):
        rows += 1
        problems += [f"line {line}: {p}" for p in check_row(row, root)]
    return rows, problems


_LINK = re.compile(r"^\[([^\]]+)\]")


def row_id(cell):
    """The id in an ``id`` cell: ``m30k``, `` `m30k` `` or a link
    ``[m30k][figures]`` / ``[m30k](docs/measurements.md#...)``."""
    cell = cell.strip()
    link = _LINK.match(cell)
    return (link.group(1) if link else cell).strip("`").strip()


def check_readme(readme, measurements, root=ROOT):
    """``(rows checked, problems)`` for the README's tables with an ``id``
    column, each row joined by its id with the row of ``measurements`` (the
    text of docs/measurements.md) that holds its source."""
    sources, problems = {}, []
    for line, row in results_tables(measurements, ("id", "source")):
        key = row_id(row["id"])
        if key in sources:
            problems.append(f"docs/measurements.md line {line}: id {key!r} "
                            "is used twice")
        sources[key] = row
    used, rows = set(), 0
    for line, row in results_tables(readme, ("id",)):
        rows += 1
        key = row_id(row["id"])
        used.add(key)
        if key not in sources:
            problems.append(f"line {line}: id {key!r} is no row of "
                            "docs/measurements.md")
            continue
        source = sources[key]
        if row.get("split") != source.get("split"):
            problems.append(f"line {line}: split {row.get('split')!r} but "
                            f"docs/measurements.md has {source.get('split')!r}")
        joined = dict(row, source=source["source"])
        problems += [f"line {line} ({key}): {p}" for p in check_row(joined, root)]
    problems += [f"docs/measurements.md: id {key!r} is in no README table"
                 for key in sorted(set(sources) - used)]
    return rows, problems


def test_readme_figures_match_their_json():
    rows, problems = check_readme(
        (ROOT / "README.md").read_text(encoding="utf-8"),
        (ROOT / "docs/measurements.md").read_text(encoding="utf-8"))
    assert rows >= 10, f"README.md has {rows} rows with an id"
    assert not problems, "README.md:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES)
def test_figures_match_their_json(page):
    rows, problems = check_text((ROOT / page).read_text(encoding="utf-8"))
    assert rows, f"{page} has no results table (a table with a source column)"
    assert not problems, f"{page}:\n" + "\n".join(problems)


def test_docs_pages_with_figures_are_all_checked():
    """A docs page with a results table must be in PAGES."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    with_tables = {
        str(p.relative_to(ROOT)) for p in pages
        if next(results_tables(p.read_text(encoding="utf-8")), None)}
    assert with_tables <= set(PAGES), sorted(with_tables - set(PAGES))


# A script of bench/ named on a page: it exists, or the page gives the
# commit of its last version (`... at 32da1ca` after its command, or just
# before it, or `git show 32da1ca:bench/x.py`).
_BENCH_SCRIPT = re.compile(r"(?<![\w/])(?:([0-9a-f]{7,40}):)?bench/(\w+\.(?:py|sh))\b")
_AT_COMMIT = re.compile(r"\bat [0-9a-f]{7,40}\b")


def missing_bench_scripts(text, root=ROOT):
    """The ``bench/`` scripts ``text`` names that neither exist under
    ``root`` nor come with a commit (in the 100 characters before or the
    400 after)."""
    return [m.group(2) for m in _BENCH_SCRIPT.finditer(text)
            if not (root / "bench" / m.group(2)).is_file() and not m.group(1)
            and not _AT_COMMIT.search(text, max(0, m.start() - 100), m.end() + 400)]


def test_pages_name_bench_scripts_that_exist():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    missing = {str(p.relative_to(ROOT)): missing_bench_scripts(p.read_text(encoding="utf-8"))
               for p in pages}
    assert not {k: v for k, v in missing.items() if v}, missing
    # The check itself: a retired script passes only with its commit.
    assert missing_bench_scripts("run `python bench/gone.py --x`.") == ["gone.py"]
    assert not missing_bench_scripts("run `python bench/gone.py --x` at 32da1ca.")
    assert not missing_bench_scripts("`git show 32da1ca:bench/gone.py`")
    assert not missing_bench_scripts("`python bench/ab.py train_step`")


_TABLE = """\
| result | value | split | host | date | source |
| --- | --- | --- | --- | --- | --- |
| REST with batching | {value} | test_2016_flickr | AMD EPYC | {date} | `bench/results/serving.json` `configs.batching.load.sentences_per_s` |
"""


@pytest.fixture
def results_root(tmp_path):
    """A repository root whose ``bench/results/serving.json`` holds a known
    figure (the checker's own tests do not depend on a real run's)."""
    path = tmp_path / "bench" / "results" / "serving.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({
        "date": "2026-11-24T05:49:07",
        "host": {"cpu_model": "AMD EPYC"},
        "configs": {"batching": {"load": {"sentences_per_s": 135.8}}},
    }))
    return tmp_path


def test_checker_accepts_a_right_row(results_root):
    assert check_text(_TABLE.format(value="135.8 sent/s", date="2026-11-24"),
                      results_root) == (1, [])


@pytest.mark.parametrize("value,date,expected", [
    ("144.1 sent/s", "2026-11-24", "disagrees"),        # another run's figure
    ("135.7 sent/s", "2026-11-24", "disagrees"),        # off by one digit
    ("135.8 sent/s, p50 112", "2026-11-24", "numbers"),  # a figure with no key
    ("135.8 sent/s", "2026-11-23", "date"),             # wrong date
])
def test_checker_rejects_a_wrong_row(results_root, value, date, expected):
    rows, problems = check_text(_TABLE.format(value=value, date=date),
                                results_root)
    assert rows == 1 and problems and expected in problems[0], problems


def test_checker_rejects_a_wrong_host_scale_and_key(results_root):
    table = _TABLE.format(value="135.8", date="2026-11-24")

    def first_problem(text):
        return check_text(text, results_root)[1][0]

    assert "host" in first_problem(table.replace("AMD EPYC", "Intel Xeon"))
    assert "disagrees" in first_problem(table.replace(
        "sentences_per_s`", "sentences_per_s` ×100"))
    assert "missing" in first_problem(table.replace(
        "configs.batching", "configs.batched"))


def test_an_edited_readme_figure_fails():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    measurements = (ROOT / "docs/measurements.md").read_text(encoding="utf-8")
    row = "| 39.18 BLEU, 0.30, 38.85, 39.42, 39.58, 37.0 min |"
    assert row in readme
    edited = readme.replace(row, row.replace("39.18", "39.82"))
    assert any("39.82 disagrees" in p for p in check_readme(edited, measurements)[1])
    # The figure is checked in the README, not only on the measurements page.
    assert check_text(measurements)[1] == []
    # A README row whose id is not on the page, or a page row no README
    # row uses, is reported too.
    assert any("no row" in p for p in check_readme(
        readme.replace("[m30k-886a308]", "[m30k-886a309]"), measurements)[1])
    assert any("in no README table" in p for p in check_readme(
        readme.replace("[m30k-886a308]", "[m30k]"), measurements)[1])
