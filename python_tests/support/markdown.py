"""The repository's markdown pages and their fenced code blocks, as the docs tests read them."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def closes(fence: str, marker: str, line: str) -> bool:
    """Whether `line` (starting with `marker`) closes a block opened with `fence`: the same
    character, at least as many, and nothing after it."""
    return marker[0] == fence[0] and len(marker) >= len(fence) and not line.strip()[len(marker):].strip()
