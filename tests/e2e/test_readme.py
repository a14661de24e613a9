"""What the README says about running the tests holds for the project's configuration."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _test_section() -> str:
    start = README.index("<!-- setup:test -->")
    return README[start:README.index("\n## ", start)]


def test_readme_says_slow_tests_are_deselected_as_the_configuration_does():
    addopts = PYPROJECT["tool"]["pytest"]["ini_options"]["addopts"]
    assert re.search(r"-m '?not slow'?", addopts)
    section = _test_section()
    assert "deselected" in section and "python -m pytest -m slow" in section
    assert re.search(r"about [\d.]+ minutes", section)  # how long the run takes


def test_readme_names_what_the_test_extra_adds():
    section = _test_section()
    assert 'pip install ".[test]"' in section
    for requirement in PYPROJECT["project"]["optional-dependencies"]["test"]:
        name = re.split(r"[<>=!~\[ ]", requirement)[0]
        assert f"`{name}`" in section, name
