"""Every ```python block in README.md and docs/*.md runs.

Blocks of one file run in order in one namespace, so a page can build on its earlier blocks,
with the repository root as the working directory.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


#: Pages whose examples run property searches, torch.compile or the command line on the library
#: (a second or more of CPU): in the slow set (CI runs it).
SLOW_PAGES = {"docs/cli.md", "docs/testing.md", "docs/torch-compile.md", "docs/writing-rules.md"}


#: Pages whose examples show rules that are wrong on purpose (fxrewrite warns of them).
WARNING_PAGES = {"docs/errors.md"}


def _page_param(page: Path) -> object:
    name = page.relative_to(ROOT).as_posix()
    marks = [pytest.mark.slow] if name in SLOW_PAGES else []
    if name in WARNING_PAGES:
        marks += [pytest.mark.filterwarnings("ignore::fxrewrite.RuleWarning"),
                  pytest.mark.filterwarnings("ignore:not rewritten:UserWarning")]
    return pytest.param(page, id=name, marks=marks)


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES if python_blocks(p)])
def test_python_blocks_run(page, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for i, block in enumerate(python_blocks(page)):
        try:
            exec(compile(block, f"{page.name}[block {i}]", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{page.name}: python block {i} failed: {type(exc).__name__}: {exc}\n{block}") from exc
