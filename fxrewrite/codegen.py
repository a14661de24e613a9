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
import shutil
from pathlib import Path

import torch.fx as fx

from .errors import TargetError

__all__ = ["annotated_code", "code_diff", "forward_code", "write_module"]

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
    """Write ``gm`` with ``GraphModule.to_folder`` so that ``from <folder> import <module_name>``
    works from any directory; returns the folder. Nothing is left behind if writing fails."""
    folder = Path(folder).resolve()
    existed = folder.exists()
    try:
        gm.to_folder(folder, module_name)
    except Exception as exc:
        if not existed:
            shutil.rmtree(folder, ignore_errors=True)
        raise TargetError(
            f"could not write the rewritten module to {folder}: {type(exc).__name__}: {exc}. GraphModule.to_folder "
            f"pickles the module's submodules; modules defined inside functions (or by torch.export's unlifted "
            f"modules) cannot be pickled. Save result.module with torch.save or re-export it instead."
        ) from exc
    return folder
