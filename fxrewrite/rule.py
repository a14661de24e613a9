"""Rules and rule sets.

A :class:`Rule` is a pattern function, a replacement function and how to apply them (guards,
priority). It is validated and its pattern traced when it is built, so a bad rule fails at its
definition, with its name and ``file:line``, before it touches any graph.

>>> import torch
>>> def pattern(x):
...     "Replaces neg(neg(x)) by x."
...     return torch.neg(torch.neg(x))
>>> def replacement(x):
...     return x
>>> r = Rule.from_functions(pattern, replacement, name="double_neg")
>>> r.name, r.priority, r.doc
('double_neg', 0, 'Replaces neg(neg(x)) by x.')

The decorator form names the rule after the pattern function::

    @fxrewrite.rule(priority=1)
    def double_neg(x):
        "Replaces neg(neg(x)) by x."
        return torch.neg(torch.neg(x))

    @double_neg.replacement
    def double_neg(x):
        return x
"""

from __future__ import annotations

import dis
import inspect
import linecache
import sys
import types
import warnings
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Union

import attrs

from .domain import Domain, Tolerance
from .errors import MetadataError, RewriteError, RuleDefinitionError, RuleWarning
from .meta import described
from .pattern import Param, Pattern, trace_pattern
from .report import NO_METADATA

__all__ = ["NUMERICS", "Guard", "Rule", "RuleBuilder", "RuleSet", "RulesLike", "as_ruleset", "describe_guard",
           "describe_numerics", "parse_numerics", "rule"]

Guard = Callable[[Any], bool]


def _origin_of(fn: Callable[..., Any]) -> str:
    """``file:line`` where ``fn`` is defined, or ``<unknown>``."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return "<unknown>"
    return f"{code.co_filename}:{code.co_firstlineno}"


#: The numerics contracts a rule may declare (``numerics=``), and what each promises.
NUMERICS: Mapping[str, str] = {
    "tolerance": "values within the declared tolerance, or assert_close's default for the output dtype",
    "bitwise": "the very same values: nan where nan, and the same sign of zero",
    "ulp:K": "every value within K units in the last place of the pattern's",
    "as-precise": "at least as close as the pattern's to the pattern computed in float64 (a more precise "
                  "rewrite passes, a less precise one does not)",
}


def parse_numerics(value: Any, context: str) -> str | None:
    """A ``numerics=`` declaration in its one spelling (``"bitwise"``, ``"ulp:2"``,
    ``"as-precise"``, ``"tolerance"``; ``("ulp", 2)`` is ``"ulp:2"``), or ``None`` when not declared.

    >>> parse_numerics(("ulp", 2), "rule 'r'"), parse_numerics("as_precise", "rule 'r'")
    ('ulp:2', 'as-precise')
    """
    if value is None:
        return None
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "ulp":
        value = f"ulp:{value[1]}"
    if isinstance(value, str):
        text = value.strip().lower().replace("_", "-").replace(" ", ":")
        if text in ("tolerance", "bitwise", "as-precise"):
            return text
        kind, _, k = text.partition(":")
        if kind == "ulp" and k.isdigit():
            return f"ulp:{int(k)}"
    raise RuleDefinitionError(
        f"{context}: numerics= takes one of 'tolerance', 'bitwise', 'ulp:K' (K a whole number >= 0, e.g. "
        f"'ulp:2') or 'as-precise', got {value!r}.")


def describe_numerics(rule: Rule) -> str:
    """One line for ``check`` and ``list``: the rule's numerics contract and what it promises.

    >>> describe_numerics(Rule.from_functions(lambda x: x + 0.0, lambda x: x, name="r", numerics="ulp:1"))
    "ulp:1 (every value within 1 units in the last place of the pattern's)"
    """
    contract = rule.numerics or "tolerance"
    if contract.startswith("ulp:"):
        return f"{contract} ({NUMERICS['ulp:K'].replace('K', contract.partition(':')[2], 1)})"
    promise = NUMERICS[contract]
    if contract == "tolerance" and rule.tolerance:
        promise = f"values within the declared {dict(rule.tolerance)}"
    return f"{contract} ({promise})"


def _guards(where: Guard | Iterable[Guard] | None, context: str) -> tuple[Guard, ...]:
    if where is None:
        return ()
    guards = (where,) if callable(where) else tuple(where)
    for g in guards:
        if not callable(g):
            raise RuleDefinitionError(
                f"{context}: where= must be a callable taking the match (or a tuple of them), got {g!r}."
            )
    return guards


def _declaration(value: Mapping[str, Any] | None) -> Any:
    """What ``Rule(tolerance=..., domain=...)`` (and ``attrs.evolve``) take: a dict or the typed
    value; ``Rule.__attrs_post_init__`` parses it, where the rule's name and origin are known."""
    return value


@attrs.frozen(eq=False)
class Rule:
    """A rewrite rule: wherever ``pattern`` occurs, compute ``replacement`` instead.

    Build one with :meth:`from_functions` or the :func:`rule` decorator. ``compiled`` is the
    traced :class:`~fxrewrite.pattern.Pattern`; ``origin`` is the ``file:line`` of the
    definition; ``tolerance``, ``domain`` and ``numerics`` (the numerics contract, see
    :data:`NUMERICS`) are declarations read by :mod:`fxrewrite.testing`. ``tolerance`` and
    ``domain`` are typed (:class:`~fxrewrite.domain.Tolerance`, :class:`~fxrewrite.domain.Domain`,
    both still read like the dicts they were declared as), validated when the rule is built, also
    through ``attrs.evolve``; ``None`` when not declared.

    >>> Rule.from_functions(lambda x: -x, lambda x: -x, name="r", domain={"rank": (1, 2)})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fxrewrite.errors.RuleDefinitionError: rule 'r' (...): unknown domain key(s) ['rank'] (did you mean 'ranks'?); ...
    """

    name: str
    pattern: Callable[..., Any]
    replacement: Callable[..., Any]
    compiled: Pattern = attrs.field(repr=False)
    where: tuple[Guard, ...] = ()
    priority: int = 0
    doc: str | None = None
    origin: str = "<unknown>"
    tolerance: Tolerance | None = attrs.field(default=None, converter=_declaration)
    domain: Domain | None = attrs.field(default=None, converter=_declaration)
    numerics: str | None = None

    def __attrs_post_init__(self) -> None:
        context = f"rule '{self.name}' ({self.origin})"
        if self.tolerance is not None and not isinstance(self.tolerance, Tolerance):
            object.__setattr__(self, "tolerance", Tolerance.parse(self.tolerance, where=context))
        if self.domain is not None and not isinstance(self.domain, Domain):
            domain = Domain.parse(self.domain, where=context)
            domain.check_names({p.name: p.kind for p in self.compiled.params}, context)
            object.__setattr__(self, "domain", domain)

    @classmethod
    def from_functions(
        cls,
        pattern: Callable[..., Any],
        replacement: Callable[..., Any],
        *,
        name: str | None = None,
        where: Guard | Iterable[Guard] | None = (),
        priority: int = 0,
        doc: str | None = None,
        origin: str | None = None,
        tolerance: Mapping[str, float] | None = None,
        domain: Mapping[str, Any] | None = None,
        numerics: str | tuple[str, int] | None = None,
    ) -> Rule:
        """Build a rule from a pattern function and a replacement function.

        The replacement must accept every parameter of the pattern, by name; it is called with
        ``Proxy`` objects for tensors and the real values of literal and module captures.
        ``numerics`` is the rule's numerics contract (:data:`NUMERICS`), enforced by the checker.
        """
        name = name or getattr(pattern, "__name__", None) or "rule"
        if name == "<lambda>":
            name = "rule"
        origin = origin or _origin_of(pattern)
        context = f"rule '{name}' ({origin})"
        if not callable(pattern) or not callable(replacement):
            raise RuleDefinitionError(f"{context}: pattern and replacement must be functions.")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise RuleDefinitionError(f"{context}: priority must be an int, got {priority!r}.")
        contract = parse_numerics(numerics, context)
        declared_tolerance = Tolerance.parse(tolerance, where=context) if tolerance is not None else None
        declared_domain = Domain.parse(domain, where=context) if domain is not None else None
        if contract not in (None, "tolerance") and tolerance:
            raise RuleDefinitionError(f"{context}: numerics={contract!r} and tolerance= both say how close is close "
                                      f"enough; declare one (a tolerance goes with numerics='tolerance').")
        compiled = trace_pattern(pattern, rule_name=name, origin=origin)
        if declared_domain is not None:
            declared_domain.check_names({p.name: p.kind for p in compiled.params}, context)
        _check_replacement_signature(compiled.params, replacement, context)
        _warn_if_replacement_drops_tensors(compiled, replacement, context)
        return cls(
            name=name,
            pattern=pattern,
            replacement=replacement,
            compiled=compiled,
            where=_guards(where, context),
            priority=priority,
            doc=doc if doc is not None else _first_doc_line(pattern),
            origin=origin,
            tolerance=declared_tolerance,
            domain=declared_domain,
            numerics=contract,
        )

    @property
    def anchor_key(self) -> Hashable:
        return self.compiled.anchor_key

    def failing_guard(self, match: Any) -> tuple[Guard, Exception | None] | None:
        """The first guard that does not accept ``match``, with the exception it raised (``None``
        when it returned False); ``None`` when every guard accepts. The one place guards run:
        the driver, ``explain`` and the property checker all ask this."""
        for guard in self.where:
            try:
                if not guard(match):
                    return guard, None
            except Exception as exc:
                return guard, exc
        return None

    def refusal(self, match: Any) -> str | None:
        """Run the guards on ``match``: ``None`` when all accept it, else which one refused.

        A guard that asks for a shape or dtype the graph does not carry (it raises
        :class:`MetadataError`) refuses, and the reason says how to get them; a guard that
        returns False on such a graph gets the same hint. A guard that raises anything else is
        an error (:class:`RewriteError` naming the rule and the node), never a silent refusal.
        """
        failed = self.failing_guard(match)
        if failed is not None:
            guard, exc = failed
            if isinstance(exc, MetadataError):
                return (f"guard {describe_guard(guard)} needs shapes/dtypes and {NO_METADATA}: pass "
                        f"example_inputs= (command line: --shapes) or rewrite a torch.export graph (--export)")
            if exc is not None:
                raise RewriteError(
                    f"rule '{self.name}' ({self.origin}): guard {describe_guard(guard)} raised "
                    f"{type(exc).__name__}: {exc} at graph node '{match.anchor.name}' "
                    f"({match.anchor.format_node()}). Fix the guard; no rewrite was applied here."
                ) from exc
            reason = f"guard {describe_guard(guard)} returned False"
            if not any(described(n) is not None for n in (match.anchor, *match.nodes)):
                reason += (f" ({NO_METADATA}; if the guard reads them, pass example_inputs= (command line: "
                           f"--shapes) or rewrite a torch.export graph (--export))")
            return reason
        return None

    def __repr__(self) -> str:
        return f"<Rule {self.name} priority={self.priority} at {self.origin}>"



def describe_guard(guard: Guard) -> str:
    """``name (file:line)`` of a guard, with its source line when it can be read."""
    name = getattr(guard, "__name__", None) or repr(guard)
    code = getattr(guard, "__code__", None)
    if code is None:
        return name
    source = linecache.getline(code.co_filename, code.co_firstlineno).strip()
    where = f"{name} ({code.co_filename}:{code.co_firstlineno})"
    return f"{where}: {source}" if source and name == "<lambda>" else where


def _first_doc_line(fn: Callable[..., Any]) -> str | None:
    doc = inspect.getdoc(fn)
    return doc.strip().splitlines()[0] if doc else None


def _check_replacement_signature(params: tuple[Param, ...], replacement: Callable[..., Any], context: str) -> None:
    try:
        sig = inspect.signature(replacement)
    except (TypeError, ValueError) as exc:
        raise RuleDefinitionError(f"{context}: cannot read the replacement's signature: {exc}") from None
    names = [p.name for p in params]
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    for p in sig.parameters.values():
        if p.kind in (p.VAR_KEYWORD,):
            continue
        if p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY):
            raise RuleDefinitionError(
                f"{context}: replacement parameter '{p.name}' cannot be passed by name; the replacement is "
                f"called with the pattern's parameters as keywords ({', '.join(names)})."
            )
        if p.name not in names and p.default is p.empty:
            raise RuleDefinitionError(
                f"{context}: replacement parameter '{p.name}' is not a pattern parameter (the pattern has "
                f"{', '.join(names)}); name the replacement's parameters after the pattern's."
            )
    missing = [n for n in names if n not in sig.parameters]
    if missing and not accepts_any:
        raise RuleDefinitionError(
            f"{context}: the replacement does not accept the pattern parameter(s) {', '.join(missing)}; "
            f"give it the same parameters as the pattern ({', '.join(names)}), even if it ignores some."
        )


def _warn_if_replacement_drops_tensors(compiled: Pattern, replacement: Callable[..., Any], context: str) -> None:
    """Warn when the replacement never reads a tensor the pattern binds: dropping an operand
    usually changes broadcasting, dtype promotion or nan/inf propagation. Decided from the
    replacement's bytecode, so nothing of it runs."""
    read = _names_read(replacement)
    if read is None:
        return
    unused = [p.name for p in compiled.params if p.kind == "tensor" and p.name not in read]
    if unused:
        warnings.warn(
            f"{context}: the replacement ignores {', '.join(repr(u) for u in unused)}, which the pattern binds "
            f"to a tensor; the rewrite then drops that tensor's effect on broadcasting, dtype and nan/inf. "
            f"If that is intended, restrict the rule with a where= guard or a declared domain.",
            RuleWarning, stacklevel=4,
        )


def _names_read(fn: Callable[..., Any]) -> set[str] | None:
    """Local names a function reads (its own body and the closures it creates), or ``None``
    when that cannot be known (``**kwargs``, no bytecode). Read from the raw bytecode where its
    layout is known (:func:`_names_read_quickly`), else through :mod:`dis` (its slow twin,
    :func:`_names_read_by_dis`; ``tests/test_rule.py`` checks both agree on the library)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None or code.co_flags & inspect.CO_VARKEYWORDS:
        return None
    if _QUICK_BYTECODE:
        return _names_read_quickly(code)
    return _names_read_by_dis(code)


_LOADS = ("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR")
_LOAD_OPCODES = frozenset(dis.opmap[name] for name in _LOADS if name in dis.opmap)

#: Bytecode read without :mod:`dis` on the Pythons whose layout :func:`_names_read_quickly`
#: knows (3.11 and 3.12: two bytes an instruction, inline caches, locals and cells indexed alike).
_QUICK_BYTECODE = (3, 11) <= sys.version_info[:2] <= (3, 12)


def _names_read_by_dis(code: types.CodeType) -> set[str]:
    names = set(code.co_cellvars)
    for instruction in dis.get_instructions(code):
        if instruction.opname in (*_LOADS, "LOAD_FAST_LOAD_FAST"):
            argval = instruction.argval
            names.update(argval if isinstance(argval, tuple) else (argval,))
    return names


def _names_read_quickly(code: types.CodeType) -> set[str]:
    """:func:`_names_read_by_dis` on Python 3.11 and 3.12, a tenth of its cost: the same walk
    as ``dis._unpack_opargs`` (inline caches skipped, ``EXTENDED_ARG`` folded in), names from the
    code's own table of locals and cells, no ``Instruction`` built."""
    loads, caches, extended = _LOAD_OPCODES, dis._inline_cache_entries, dis.opmap["EXTENDED_ARG"]  # type: ignore[attr-defined]
    name_of = code._varname_from_oparg  # type: ignore[attr-defined]
    raw = code.co_code
    names = set(code.co_cellvars)
    prefix = skip = 0
    for i in range(0, len(raw), 2):
        if skip:
            skip -= 1
            continue
        op = raw[i]
        skip = caches[op]
        if op < dis.HAVE_ARGUMENT:
            prefix = 0
            continue
        arg = raw[i + 1] | prefix
        prefix = arg << 8 if op == extended else 0
        if op in loads:
            names.add(name_of(arg))
    return names


class RuleBuilder:
    """What ``@fxrewrite.rule`` returns: a pattern waiting for its replacement.

    ``rule`` is the finished :class:`Rule` once ``@<pattern>.replacement`` decorated a function.
    A builder left in a module (the replacement was never given, or was given another name, so
    the finished rule is bound to that name and the pattern's name still holds the builder) is
    explained by :meth:`unfinished_message`.
    """

    def __init__(self, pattern: Callable[..., Any], options: dict[str, Any]) -> None:
        self.pattern = pattern
        self.options = options
        self.rule: Rule | None = None
        self._replacement: Callable[..., Any] | None = None

    def replacement(self, fn: Callable[..., Any]) -> Rule:
        """Decorate the replacement function; returns the finished :class:`Rule`."""
        self.rule = Rule.from_functions(self.pattern, fn, **self.options)
        self._replacement = fn
        return self.rule

    def unfinished_message(self, bound_as: str | None = None, where: str | None = None) -> str:
        """Why this builder is not a rule, and the fix; ``bound_as`` is the name that holds it,
        ``where`` the file it is in (default: the pattern's file)."""
        name = bound_as or self.pattern.__name__
        where = where or _origin_of(self.pattern).rpartition(":")[0]
        line = self._line_of(self.pattern)
        if self._replacement is None:
            return (f"{where}:{line}: '{name}' is a pattern awaiting its replacement: decorate the replacement "
                    f"function with @{name}.replacement and give it the same name ('def {name}(...)'), so the "
                    f"finished rule replaces the pattern under that name.")
        replacement = getattr(self._replacement, "__name__", "the replacement")
        return (f"{where}:{line}: '{name}' still holds the bare pattern: its replacement '{replacement}' (line "
                f"{self._line_of(self._replacement)}) was decorated with @{name}.replacement but has a name of its "
                f"own, so the finished rule is bound to '{replacement}' and '{name}' is left over. Give the "
                f"replacement "
                f"the pattern's name ('def {name}(...)' under '@{name}.replacement'), or pass the name to the "
                f"decorator and delete the leftover: '@fxrewrite.rule(name=\"{name}\")' on the pattern, then "
                f"'del {name}' after the replacement.")

    @staticmethod
    def _line_of(fn: Callable[..., Any]) -> int | str:
        code = getattr(inspect.unwrap(fn), "__code__", None)
        return code.co_firstlineno if code is not None else "?"

    def __repr__(self) -> str:
        name, state = self.pattern.__name__, "awaiting" if self._replacement is None else "finished by"
        return f"<pattern {name} (line {self._line_of(self.pattern)}) {state} @{name}.replacement>"


def rule(
    pattern: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    where: Guard | Iterable[Guard] | None = (),
    priority: int = 0,
    doc: str | None = None,
    tolerance: Mapping[str, float] | None = None,
    domain: Mapping[str, Any] | None = None,
    numerics: str | tuple[str, int] | None = None,
) -> Any:
    """Decorator: mark a pattern function; then decorate its replacement with
    ``@<pattern>.replacement`` to obtain the :class:`Rule`. Usable bare (``@rule``) or with
    options (``@rule(priority=2, where=...)``)."""
    options = dict(name=name, where=where, priority=priority, doc=doc, tolerance=tolerance, domain=domain,
                   numerics=numerics)

    def wrap(fn: Callable[..., Any]) -> RuleBuilder:
        return RuleBuilder(fn, options)

    return wrap(pattern) if pattern is not None else wrap


RulesLike = Union[Rule, "RuleSet", Iterable[Rule]]


def _as_tuple(rules: Iterable[Rule]) -> tuple[Rule, ...]:
    return tuple(rules)


@attrs.frozen(eq=False)
class RuleSet:
    """An ordered collection of rules with unique names.

    >>> import torch
    >>> rs = RuleSet([Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="double_neg")])
    >>> len(rs), rs["double_neg"].name, [r.name for r in rs]
    (1, 'double_neg', ['double_neg'])
    """

    rules: tuple[Rule, ...] = attrs.field(converter=_as_tuple)

    def __attrs_post_init__(self) -> None:
        seen: dict[str, Rule] = {}
        for r in self.rules:
            if not isinstance(r, Rule):
                raise RuleDefinitionError(f"RuleSet takes Rule objects, got {r!r} ({type(r).__name__}).")
            if r.name in seen:
                raise RuleDefinitionError(
                    f"two rules are named '{r.name}': one at {seen[r.name].origin}, one at {r.origin}; "
                    f"rename one of them (rule names must be unique in a rule set)."
                )
            seen[r.name] = r

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __getitem__(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(f"no rule named '{name}'; the rule set has {[r.name for r in self.rules]}")

    def __contains__(self, name: object) -> bool:
        return any(r.name == name for r in self.rules)

    def __add__(self, other: RulesLike) -> RuleSet:
        return RuleSet((*self.rules, *as_ruleset(other).rules))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rules)


def as_ruleset(rules: RulesLike) -> RuleSet:
    """Accept a :class:`Rule`, a :class:`RuleSet` or an iterable of rules."""
    if isinstance(rules, RuleSet):
        return rules
    if isinstance(rules, Rule):
        return RuleSet((rules,))
    if isinstance(rules, RuleBuilder):
        raise RuleDefinitionError(rules.unfinished_message())
    try:
        return RuleSet(tuple(rules))
    except TypeError:
        raise RuleDefinitionError(f"expected a Rule, a RuleSet or an iterable of rules, got {rules!r}.") from None
