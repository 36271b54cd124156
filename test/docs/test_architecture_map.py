"""docs/architecture.md is a true map: every source file appears in it under its folder's heading, and
every file it names exists."""

import re
import subprocess

from doc_blocks import ROOT

MAP = ROOT / "docs" / "architecture.md"
# The folders the map lists file by file (a heading "### `folder/`" each), and the files that count.
MAPPED = re.compile(r"^(csrc/(?:net/|python/)?\w+|torch_recdev|test/\w+|benchmarks|examples)/[^/]+\.(cpp|h|py)$")
_HEADING = re.compile(r"^### (.*)$")
_FOLDER = re.compile(r"`([\w./]+)/`")
# An entry, or an entry nested under another (a header's implementation files under the header).
_ENTRY = re.compile(r"^(?:  )?- ((?:`[^`]+`(?:, | / | and )?)+):")


def tracked_sources():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return {f for f in files if MAPPED.match(f)}


def mapped_files():
    """{path: line} for every file named at the start of an entry under a folder heading."""
    found, folders = {}, []
    for number, line in enumerate(MAP.read_text(encoding="utf-8").splitlines(), 1):
        heading = _HEADING.match(line)
        if heading:
            folders = _FOLDER.findall(heading.group(1))
            continue
        entry = _ENTRY.match(line)
        if entry and folders:
            for name in re.findall(r"`([^`]+)`", entry.group(1)):
                nested = f"{folders[0]}/{name}"  # "results/x.md" under benchmarks/, or a path from the root
                found[name if "/" in name and not (ROOT / nested).exists() else nested] = number
    return found


def test_every_source_file_is_on_the_map():
    missing = sorted(tracked_sources() - set(mapped_files()))
    assert not missing, f"docs/architecture.md does not map: {missing}; add an entry under the folder's heading"


def test_every_file_on_the_map_exists():
    stale = sorted(f"{path} (line {line})" for path, line in mapped_files().items()
                   if "*" not in path and not (ROOT / path).exists() and not path.endswith(".so"))
    assert not stale, f"docs/architecture.md names files that do not exist: {stale}"
