"""The fenced Python blocks of README.md and docs/*.md, with the doc-test directives written before
them, so that the docs run as tests.

A directive is an HTML comment on the line before a block (invisible when the page is rendered):

    <!-- doc-test: skip (why) -->        the block is not meant to run (it says why)
    <!-- doc-test: shards 7070 7071 -->  start one recdev-server per port named, and run the block
                                         with those ports replaced by the servers' real ones

A page's blocks run in order in one fresh interpreter, so a block may use what an earlier one of the
same page defined.
"""

import dataclasses
import pathlib
import re
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_DIRECTIVE = re.compile(r"<!--\s*doc-test:\s*(.*?)\s*-->")


@dataclasses.dataclass
class Block:
    page: pathlib.Path
    line: int  # of the opening fence, 1-based
    code: str
    skip: str | None = None  # why, when the block is not meant to run
    shard_ports: tuple[str, ...] = ()


def doc_pages():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(page):
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, k = [], 0
    while k < len(lines):
        fence = _FENCE.match(lines[k])
        if not fence:
            k += 1
            continue
        end = next(j for j in range(k + 1, len(lines)) if lines[j].strip() == "```")
        if fence.group(2) == "python":
            block = Block(page, k + 1, textwrap.dedent("\n".join(lines[k + 1:end])))
            previous = lines[k - 1] if k > 0 else ""
            directive = _DIRECTIVE.search(previous)
            if directive:
                apply_directive(block, directive.group(1))
            blocks.append(block)
        k = end + 1
    return blocks


def apply_directive(block, text):
    word, _, rest = text.partition(" ")
    if word == "skip":
        block.skip = rest or "marked skip"
    elif word == "shards":
        block.shard_ports = tuple(rest.split())
    else:
        raise ValueError(f"{block.page.name}:{block.line}: unknown doc-test directive {text!r}")
