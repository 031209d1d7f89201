"""The documentation stays true to the tree and the package: every relative link in README.md and
docs/**/*.md resolves to an existing file (and an #anchor into a markdown file to one of its
headings, as GitHub names them), every `torch_offload.<name>` shown in code imports, and every
table row has as many cells as its header."""
import importlib
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from python_tests.support.markdown import DOCS, FENCE, ROOT, closes

_INLINE_CODE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+[\"'(][^)]*)?\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
_ATX = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)\s*$")
_HTML_ID = re.compile(r"<a\s+(?:name|id)=[\"']([^\"']+)[\"']", re.I)
_EXTERNAL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|//)")
# torch_offload.<dotted name>, not part of a longer identifier or path (libtorch_offload.so).
_NAME = re.compile(r"(?<![\w.])torch_offload(?:\.[A-Za-z_]\w*)+")


def _split(text: str):
    """(prose with fenced code blocks removed, [fenced code blocks])."""
    prose, blocks, block, fence = [], [], None, None
    for line in text.splitlines():
        marker = FENCE.match(line)
        if fence is None and marker:
            fence, block = marker.group(1), []
        elif fence is not None and marker and closes(fence, marker.group(1), line):
            blocks.append("\n".join(block))
            fence = block = None
        elif fence is not None:
            block.append(line)
        else:
            prose.append(line)
    if block is not None:  # an unclosed fence runs to the end of the file
        blocks.append("\n".join(block))
    return "\n".join(prose), blocks


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation dropped, spaces to hyphens."""
    text = _INLINE_CODE.sub(lambda m: m.group(2).strip(), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set:
    prose, _ = _split(path.read_text(encoding="utf-8"))
    anchors, seen, previous = set(), {}, ""
    for line in prose.splitlines():
        heading = None
        atx = _ATX.match(line)
        if atx:
            heading = atx.group(2)
        elif _SETEXT.match(line) and previous.strip() and not previous.lstrip().startswith(("|", "-", "*")):
            heading = previous.strip()
        if heading is not None:
            base = _slug(heading)
            count = seen.get(base, 0)
            seen[base] = count + 1
            anchors.add(base if count == 0 else f"{base}-{count}")
        anchors.update(_HTML_ID.findall(line))
        previous = line
    return anchors


def _links(text: str):
    prose, _ = _split(text)
    prose = _INLINE_CODE.sub("", prose)  # a link written inside code is not a link
    for match in list(_LINK.finditer(prose)) + list(_REFERENCE.finditer(prose)):
        yield match.group(1).strip("<>")


def _code(text: str):
    prose, blocks = _split(text)
    return blocks + [m.group(2) for m in _INLINE_CODE.finditer(prose)]


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def test_the_docs_exist():
    assert (ROOT / "README.md").is_file()
    assert len(DOCS) > 1, "docs/ has no markdown files"


def _target(doc: Path, target: str):
    """(the file a relative link in `doc` points to, its #anchor); None for an external link."""
    if not target or _EXTERNAL.match(target):
        return None
    path_part, _, anchor = target.partition("#")
    path_part = unquote(path_part)
    if not path_part:
        return doc, anchor
    if path_part.startswith("/"):  # GitHub resolves /path from the repository root
        return ROOT / path_part.lstrip("/"), anchor
    return (doc.parent / path_part).resolve(), anchor


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_relative_links_resolve(doc):
    broken = []
    anchors = {}
    for target in _links(doc.read_text(encoding="utf-8")):
        resolved = _target(doc, target)
        if resolved is None:
            continue
        path, anchor = resolved
        if not path.exists():
            broken.append(f"{target}: no such file ({path})")
            continue
        if anchor and path.is_file() and path.suffix == ".md":
            if path not in anchors:
                anchors[path] = _anchors(path)
            if unquote(anchor).lower() not in anchors[path]:
                broken.append(f"{target}: no heading with anchor #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)} has broken links:\n" + "\n".join(broken)


def _resolve(name: str):
    """The object `name` names: attributes from the top package down, importing submodules that
    are not attributes yet (torch_offload.bench, torch_offload.integrations)."""
    parts = name.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=2):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:i]))
    return obj


def _named_in_docs() -> dict:
    """torch_offload.<name> -> the docs that show it in code."""
    names = {}
    for doc in DOCS:
        for code in _code(doc.read_text(encoding="utf-8")):
            for name in _NAME.findall(code):
                names.setdefault(name, []).append(str(doc.relative_to(ROOT)))
    return names


def test_the_docs_show_torch_offload_names():
    assert _named_in_docs(), "no torch_offload.<name> in the docs' code: the pattern is broken"


def test_torch_offload_names_in_code_import():
    pytest.importorskip("torch")
    failures = []
    for name, docs in sorted(_named_in_docs().items()):
        try:
            _resolve(name)
        except Exception as error:  # noqa: BLE001 (ImportError, AttributeError, a failing import)
            failures.append(f"{name} ({', '.join(sorted(set(docs)))}): {type(error).__name__}: {error}")
    assert not failures, "names the docs show that do not import:\n" + "\n".join(failures)


RECORDS = ROOT / "benchmarks" / "records"


def _linked_files() -> set:
    """Every file README.md and docs/ link to (links into the tree only)."""
    return {resolved[0].resolve() for doc in DOCS for target in _links(doc.read_text(encoding="utf-8"))
            if (resolved := _target(doc, target)) is not None}


def test_every_record_backs_a_published_figure():
    """benchmarks/records/ holds what the docs publish and nothing else (benchmarks/README.md says
    so): each file is linked from README.md or docs/, each JSON names the command that made it, and
    the folder stays at most 50 files and under 2 MB."""
    files = sorted(p for p in RECORDS.iterdir() if p.is_file())
    assert files, "benchmarks/records/ is empty"
    linked = _linked_files()
    unlinked = [p.name for p in files if p.resolve() not in linked]
    assert not unlinked, "records no page links to (remove them or publish their figures):\n" + "\n".join(unlinked)
    without_command = []
    for path in files:
        if path.suffix == ".json":
            text = path.read_text(encoding="utf-8")
            if '"command"' not in text and '"commands"' not in text:
                without_command.append(path.name)
    assert not without_command, "records without the command that made them:\n" + "\n".join(without_command)
    assert len(files) <= 50, f"{len(files)} files in benchmarks/records/, at most 50"
    size = sum(p.stat().st_size for p in files)
    assert size < 2_000_000, f"benchmarks/records/ holds {size} bytes, under 2 MB"


_DELIMITER_ROW = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def _cells(row: str) -> int:
    """The cells of a table row, split as GitHub does: at every pipe not escaped with a backslash."""
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return len(re.split(r"(?<!\\)\|", row))


def _table_rows(text: str):
    """(row, cells, header cells) of every body row of every table in the prose."""
    lines = _split(text)[0].splitlines()
    header = None
    for number, line in enumerate(lines):
        if not line.lstrip().startswith("|"):
            header = None
        elif header is None:
            following = lines[number + 1] if number + 1 < len(lines) else ""
            header = _cells(line) if _DELIMITER_ROW.match(following) else None
        elif not _DELIMITER_ROW.match(line):
            yield line, _cells(line), header


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_table_rows_have_their_headers_cells(doc):
    """A row with a cell too few or too many renders its figures under the wrong columns."""
    wrong = [f"{cells} cells, its header {header}: {row[:100]}"
             for row, cells, header in _table_rows(doc.read_text(encoding="utf-8")) if cells != header]
    assert not wrong, f"{doc.relative_to(ROOT)} has table rows that do not match their header:\n" + "\n".join(wrong)
