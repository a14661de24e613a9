"""The errors fxrewrite raises.

Every error derives from :class:`FxRewriteError`, and also from the builtin whose
meaning fits, so ``except ValueError`` keeps working for callers who do not know us::

    FxRewriteError
     ├── RuleDefinitionError   (ValueError)     a rule is malformed; raised when it is built
     ├── RuleSyntaxError       (SyntaxError)    a .fxr file does not parse
     ├── RuleLoadError         (ImportError)    a rule file or directory cannot be loaded
     ├── RewriteError          (RuntimeError)   applying a rule to a graph failed; graph untouched
     │    ├── DidNotConverge                    the rewrite budget ran out (rules undo each other)
     │    └── ModuleWriteError                  a replacement wrote into a module the match captured; undone
     ├── MetadataError         (LookupError)    a guard needs shapes/dtypes the graph does not carry
     ├── TargetError           (ValueError)     a model given to the CLI cannot be imported, built or traced
     ├── ArgumentError         (TypeError, ValueError)  a public function got an argument it cannot use
     ├── Refuse                                 raised by a replacement to decline a match (not an error)
     └── NotEquivalent         (AssertionError) a rewrite changed what the program computes

Warnings: :class:`RuleWarning` (a ``UserWarning``) flags a rule that is probably wrong but
may be intended, e.g. a replacement that ignores a tensor the pattern binds.

Messages say what happened, where (rule name and ``file:line``, graph node) and what to do.
"""

from __future__ import annotations

__all__ = [
    "ArgumentError",
    "Refuse",
    "DidNotConverge",
    "FxRewriteError",
    "MetadataError",
    "ModuleWriteError",
    "NotEquivalent",
    "RewriteError",
    "RuleDefinitionError",
    "RuleLoadError",
    "RuleSyntaxError",
    "RuleWarning",
    "TargetError",
]


class FxRewriteError(Exception):
    """Root of every error raised by fxrewrite."""


class RuleDefinitionError(FxRewriteError, ValueError):
    """A rule is malformed: bad signature, untraceable pattern, unknown capture type, ..."""


class RuleSyntaxError(FxRewriteError, SyntaxError):
    """A rule file written in the fxrewrite DSL does not parse.

    The message already shows ``file:line:column``, the line and a caret; ``str()`` does not
    append Python's ``(file, line N)`` again.
    """

    def __str__(self) -> str:
        return str(self.msg)


class RuleLoadError(FxRewriteError, ImportError):
    """A rule file or rules directory cannot be loaded."""


class RewriteError(FxRewriteError, RuntimeError):
    """Applying a rule to a graph failed. The graph is left as it was before that rewrite."""


class DidNotConverge(RewriteError):
    """The rewrite budget was exhausted: some rules keep firing (often a rule and its inverse)."""


class MetadataError(FxRewriteError, LookupError):
    """A guard asked for a shape, dtype or device that the graph's nodes do not carry."""


class TargetError(FxRewriteError, ValueError):
    """A model named on the command line cannot be imported, built, traced or exported."""


class ArgumentError(FxRewriteError, TypeError, ValueError):
    """A public function was called with an argument it cannot use; the message names the
    argument, what it got and what it takes. Also a ``TypeError`` and a ``ValueError``, so
    callers catching either keep working."""


class Refuse(FxRewriteError):
    """Raised by a replacement to decline the match it was given, with the reason: the rewrite
    leaves that place as it was, records the reason in the report (and ``explain``), and goes on.
    A replacement's refusal is not an error; anything else a replacement raises is.

    >>> import torch, fxrewrite
    >>> def replacement(x):
    ...     if x.shape[-1] % 8:
    ...         raise fxrewrite.Refuse("the fused kernel needs a multiple of 8 channels")
    ...     return torch.relu(x) * 2
    >>> rule = fxrewrite.Rule.from_functions(lambda x: torch.relu(x) + torch.relu(x), replacement, name="r")
    >>> result = fxrewrite.rewrite(lambda a: torch.relu(a) + torch.relu(a), rule, example_inputs=(torch.ones(2, 5),))
    >>> result.report.applied["r"], result.report.reasons["r"][0]
    (0, "at 'add': the replacement refused: the fused kernel needs a multiple of 8 channels")
    """


class NotEquivalent(FxRewriteError, AssertionError):
    """A rewritten program computes something different from the original."""


class RuleWarning(UserWarning):
    """A rule is probably wrong, but may be intended (so it is a warning, not an error)."""


class ModuleWriteError(RewriteError):
    """A replacement wrote into a parameter or buffer of a module its match captured (an
    in-place op such as ``conv.weight.mul_(...)``, ``.data`` swapped, an attribute reassigned).
    The module is shared with the rest of the program, and often with the caller's model: the
    write was undone before this error was raised, and the graph left as it was. Compute new
    tensors and register a new module instead (``copy.deepcopy(conv)`` with new weights)."""
