"""Regenerated source: code annotated with the rule behind each rewritten line, before/after
diffs, and writing a rewritten module to a folder it can be imported from.

>>> import torch, fxrewrite
>>> rule = fxrewrite.Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
>>> before = torch.fx.symbolic_trace(lambda a: torch.neg(torch.neg(a)) + 1)
>>> after = fxrewrite.rewrite(before, rule).module
>>> print(code_diff(before, after))
--- before
+++ after
@@ -1,5 +1,3 @@
 def forward(self, a):
-    neg = torch.neg(a);  a = None
-    neg_1 = torch.neg(neg);  neg = None
-    add = neg_1 + 1;  neg_1 = None
+    add = a + 1;  a = None
     return add
"""

from __future__ import annotations

import difflib
import re
import shutil
import warnings
from pathlib import Path

import torch.fx as fx

from .errors import TargetError

__all__ = ["annotated_code", "check_folder", "code_diff", "forward_code", "pickled_submodules", "write_module"]

_NO_TRACE = "# No stacktrace found for following nodes"


def forward_code(gm: fx.GraphModule) -> str:
    """The regenerated ``forward`` source, without the blank lines fx surrounds it with."""
    return gm.code.strip("\n").rstrip() + "\n"


def annotated_code(gm: fx.GraphModule) -> str:
    """``forward`` with a ``# File: ... in RULE, code: fxrewrite rule RULE: doc`` comment above
    each region a rule wrote (and the original source lines where the tracer recorded them)."""
    src = gm.graph.python_code("self", verbose=True).src
    lines = [line for line in src.strip("\n").splitlines() if line.strip() != _NO_TRACE]
    return "\n".join(lines).rstrip() + "\n"


def code_diff(before: fx.GraphModule, after: fx.GraphModule, *, fromfile: str = "before",
              tofile: str = "after") -> str:
    """A unified diff of the two modules' ``forward`` code."""
    diff = difflib.unified_diff(forward_code(before).splitlines(keepends=True),
                                forward_code(after).splitlines(keepends=True), fromfile, tofile)
    return "".join(diff).rstrip("\n")


def write_module(gm: fx.GraphModule, folder: str | Path, module_name: str = "RewrittenModule") -> Path:
    """Write ``gm`` with ``GraphModule.to_folder`` as a package ``from <folder> import
    <module_name>`` imports; returns the folder (absolute). Nothing is left behind if writing fails.

    ``to_folder`` writes the absolute paths of the weight files into ``module.py``; they are
    rewritten relative to ``module.py``'s own ``__file__``, so the folder can be moved, copied
    or shipped and imported from its new place.

    >>> import tempfile, torch
    >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    >>> folder = write_module(gm, Path(tempfile.mkdtemp()) / "tiny")
    >>> str(folder) in (folder / "module.py").read_text()
    False
    """
    folder = check_folder(folder)
    created = _first_missing(folder)  # removed again if writing fails
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():  # the pickled submodules are listed by pickled_submodules()
            warnings.filterwarnings("ignore", message="Was not able to save the following children modules")
            gm.to_folder(folder, module_name)
        _relocatable(folder / "module.py", folder)
    except Exception as exc:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        if isinstance(exc, TargetError):
            raise
        raise TargetError(
            f"could not write the rewritten module to {folder}: {type(exc).__name__}: {exc}. GraphModule.to_folder "
            f"pickles the module's submodules; modules defined inside functions (or by torch.export's unlifted "
            f"modules) cannot be pickled. Save result.module with torch.save or re-export it instead."
        ) from exc
    return folder


def check_folder(folder: str | Path) -> Path:
    """``folder`` made absolute, when :func:`write_module` can write to it (its name is imported
    as a package, so it must be an identifier); else a :class:`TargetError` saying what to use."""
    folder = Path(folder).resolve()
    if not folder.name.isidentifier():
        raise TargetError(f"cannot write the rewritten module to {folder}: the folder is imported as a Python "
                          f"package, so its name must be an identifier; use e.g. '{_identifier(folder.name)}'.")
    return folder


def _first_missing(folder: Path) -> Path | None:
    """The outermost of ``folder`` and its parents that does not exist yet."""
    missing = None
    for path in (folder, *folder.parents):
        if path.exists():
            return missing
        missing = path
    return missing


def pickled_submodules(folder: Path) -> list[str]:
    """The submodules :func:`write_module` pickled whole (not ``torch.nn`` classes ``to_folder``
    writes as code): importing the folder unpickles them, which needs their classes importable."""
    return sorted(p.stem for p in Path(folder).glob("*.pt") if p.name != "state_dict.pt")


_HERE = "_fxrewrite_folder"  # the name module.py gives its own directory


def _relocatable(module_file: Path, folder: Path) -> None:
    """Replace the absolute ``r'<folder>/<file>'`` paths ``to_folder`` wrote by paths relative to
    ``module.py``'s ``__file__``."""
    source = module_file.read_text()
    absolute = re.compile(r"r'" + re.escape(str(folder)) + r"[/\\]([^'/\\]+)'")
    relative = absolute.sub(lambda m: f"{_HERE} / {m.group(1)!r}", source)
    if str(folder) in relative:
        raise TargetError(f"{module_file} still names {folder} after fxrewrite made its paths relative: torch's "
                          f"GraphModule.to_folder writes paths in a way fxrewrite does not know. Please report it; "
                          f"meanwhile save result.module with torch.save.")
    header = f"import pathlib as _pathlib\n{_HERE} = _pathlib.Path(__file__).resolve().parent\n"
    module_file.write_text(header + relative)


def _identifier(name: str) -> str:
    cleaned = re.sub(r"\W", "_", name)
    return cleaned if cleaned.isidentifier() else f"_{cleaned}"
