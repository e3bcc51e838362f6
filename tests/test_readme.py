"""README.md's "In your stack" snippets (padded and varlen calls, torch.compile,
Hugging Face transformers, KV caches) run as written: each is written to a file and run
in this process, its kernels under the Triton interpreter (tests/conftest.py),
in the kernels tier.  The quick tier checks that the section still holds them."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## In your stack"


def snippets() -> list[str]:
    """The ```python blocks of README's SECTION, in order."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{SECTION}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"\n```python\n(.*?)\n```\n", text[start:end], flags=re.DOTALL)


# Each snippet by name, with what it shows.
SNIPPETS = {
    "sequences": "mod.sequences(cu_seqlens_q=",
    "torch_compile": "torch.compile(",
    "transformers": "flashgen.hf.register(",
    "kv_cache": "block_table=block_table",
}
NAMES = tuple(SNIPPETS)


def test_the_section_holds_the_snippets_that_are_run():
    found = snippets()
    assert len(found) == len(SNIPPETS)
    for snippet, shown in zip(found, SNIPPETS.values()):
        assert shown in snippet


@pytest.mark.kernels
@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
def test_snippet_runs(index, tmp_path):
    import torch

    path = tmp_path / f"{NAMES[index]}.py"
    path.write_text(snippets()[index] + "\n", encoding="utf-8")
    torch._dynamo.reset()
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        torch._dynamo.reset()
