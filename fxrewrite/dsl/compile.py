"""Compile the syntax tree of a rule file into :class:`~fxrewrite.rule.Rule` objects.

Each rule becomes a real Python *pattern function* and *replacement function* whose parameters
are the rule's variables, and goes through :meth:`Rule.from_functions` like a rule written in
Python: the same validation, the same tracing, the same ``Rule``. The functions interpret the
rule's expressions on whatever they receive (fx Proxies while the pattern is traced and while
the replacement is spliced in, real tensors when a rule is tested); ``where`` conditions become
guards reading the match.

>>> from fxrewrite.dsl.parse import parse
>>> rules = compile_rules(parse("rule mul_one:\\n    x * 1 => x\\n", source="algebra.fxr"))
>>> r = rules["mul_one"]
>>> r.origin, [p.name for p in r.compiled.params]
('algebra.fxr:1', ['x'])

**Names.** A bare name is, in this order: ``_`` (a fresh anonymous variable), a ``let`` name of
the rule, a name in scope (:data:`DEFAULT_NAMES`, the caller's ``names=``, the file's ``use``
aliases), or else a variable, which must start with a lower-case letter. Nothing else is
reachable: loading a rule file runs no code from it (see "Trust model" in docs/dsl.md).
"""

from __future__ import annotations

import difflib
import inspect
import keyword
import math
import operator
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from ..domain import Domain
from ..errors import RuleDefinitionError
from ..pattern import LITERAL_TYPES
from ..rule import Rule, RuleSet, parse_numerics
from . import ast
from .parse import MAX_DEPTH
from .scope import (
    DEFAULT_NAMES,
    RESERVED_WORDS,
    PathError,
    Scope,
    check_attribute_name,
    check_new_name,
    located_error,
    shown,
)

__all__ = ["DEFAULT_NAMES", "DOMAIN_SETTINGS", "GUARD_TENSOR_ATTRIBUTES", "INPUT_SETTINGS", "RESERVED_WORDS",
           "TOLERANCE_SETTINGS", "MatchView", "Scope", "compile_rule", "compile_rules"]

#: What a where condition may read of a tensor variable: the match shows it as a view of the
#: graph node's metadata (:class:`fxrewrite.match.TensorView`), not as a tensor.
GUARD_TENSOR_ATTRIBUTES = frozenset({"device", "dim", "dtype", "ndim", "shape", "size"})
_TEMPLATE_NAMES = frozenset({"_fxr", "_evaluate"})
_DECLARATION_SIDES = frozenset({"declaration", "module"})

#: ``tolerance`` settings (read by fxrewrite.testing: the comparison of pattern and replacement).
TOLERANCE_SETTINGS = ("atol", "rtol")
#: ``domain`` settings for the whole rule (fxrewrite.testing.DOMAIN_KEYS without the three that
#: other forms of the line set: ``domain x: ...``, ``domain n in (...)``, ``domain conv = ...``).
DOMAIN_SETTINGS = ("dtypes", "max_value", "min_value", "mixed_dtypes", "non_contiguous", "ranks", "shapes", "sides",
                   "special_values")
#: ``domain x: ...`` settings for one tensor input.
INPUT_SETTINGS = ("dtypes", "max_value", "min_value", "shape", "special_values")
_MAX_CONSTANT_BITS = 1 << 16
_MAX_CONSTANT_LENGTH = 1 << 16

Closure = Callable[["_Frame"], Any]


def compile_rules(file: ast.RuleFile, *, names: Mapping[str, Any] | None = None) -> RuleSet:
    """The :class:`RuleSet` of a parsed rule file, in source order.

    ``names`` adds names to the file's scope (trusted: the caller's own objects).
    Raises :class:`RuleDefinitionError` naming ``file:line:column`` for every problem.
    """
    scope = Scope.build(file, names)
    _check_unique_names(file)
    return RuleSet(tuple(compile_rule(r, file.source, scope) for r in file.rules))


def _check_unique_names(file: ast.RuleFile) -> None:
    seen: dict[str, ast.RuleDef] = {}
    for r in file.rules:
        if r.name in seen:
            first = seen[r.name].span
            raise _error(file.source, r.span, f"rule '{r.name}' is defined twice: at {file.source.name}:{first.line} "
                                              f"and at {file.source.name}:{r.span.line}; rename one of them.")
        seen[r.name] = r


_error = located_error


def _runtime_error(src: ast.SourceText, span: ast.Span, message: str) -> RuleDefinitionError:
    """An error while a rule's functions run (tracing, rewriting): one line, because the engine
    embeds it in its own message."""
    return RuleDefinitionError(f"{src.where(span)}: {message}")


def names_in(node: ast.Expr) -> list[ast.Name]:
    """The :class:`~ast.Name` nodes of an expression, in evaluation order (lets not followed)."""
    return [n for n in ast.walk(node) if isinstance(n, ast.Name)]


# ---- one rule ------------------------------------------------------------------------------------


class _RuleContext:
    """What the compilers of one rule share: source, scope, lets, captures, wildcard names."""

    def __init__(self, rule: ast.RuleDef, src: ast.SourceText, scope: Scope) -> None:
        self.rule, self.src, self.scope = rule, src, scope
        self.context = f"rule '{rule.name}'"
        self.lets = self._lets()
        self.let_refs = self._let_references()
        self.let_mentions_variable = self._lets_mentioning_variables()
        self.capture_types = self._captures()
        self.wildcards = self._wildcards()

    def error(self, span: ast.Span, message: str) -> RuleDefinitionError:
        return _error(self.src, span, f"{self.context}: {message}")

    def kind(self, variable: str) -> str:
        annotation = self.capture_types.get(variable)
        if annotation is None:
            return "tensor"
        return "literal" if annotation in LITERAL_TYPES else "module"

    def _lets(self) -> dict[str, tuple[int, ast.Let]]:
        lets: dict[str, tuple[int, ast.Let]] = {}
        for i, let in enumerate(self.rule.lets):
            check_new_name(self.src, let.span, let.name, what="a let name", scope=self.scope, context=self.context)
            if let.name in lets:
                first = lets[let.name][1].span.line
                raise self.error(let.span, f"'{let.name}' is defined by let twice (lines {first} and "
                                           f"{let.span.line}); give the second one another name.")
            lets[let.name] = (i, let)
        return lets

    def _let_references(self) -> dict[str, tuple[str, ...]]:
        """The lets each let's expression names directly. A let may only use the lets above it:
        a let that uses itself or a later one is refused here, before anything follows the
        references, so that every later walk over lets ends (and is linear in the rule's size)."""
        refs: dict[str, tuple[str, ...]] = {}
        for index, let in self.lets.values():
            used: dict[str, None] = {}
            for node in names_in(let.value):
                if node.id not in self.lets:
                    continue
                other_index, other = self.lets[node.id]
                if other_index == index:
                    raise self.error(node.span, f"let '{let.name}' (line {let.span.line}) uses itself; a let can "
                                                f"only use the lets above it. Give the value it builds on another "
                                                f"name, defined by a let above this one.")
                if other_index > index:
                    raise self.error(node.span, f"let '{let.name}' (line {let.span.line}) uses '{node.id}', which "
                                                f"is defined by a later let (line {other.span.line}); a let can only "
                                                f"use the lets above it: move 'let {node.id}' above this line.")
                used.setdefault(node.id)
            refs[let.name] = tuple(used)
        return refs

    def _lets_mentioning_variables(self) -> dict[str, bool]:
        """Whether each let's value depends on a variable of the rule (in one pass, in order)."""
        mentions: dict[str, bool] = {}
        for _, let in self.lets.values():
            mentions[let.name] = self.mentions_variable(let.value, mentions)
        return mentions

    def mentions_variable(self, node: ast.Expr, lets: Mapping[str, bool] | None = None) -> bool:
        """Whether ``node`` reads a variable or ``_``, directly or through a let."""
        lets = self.let_mentions_variable if lets is None else lets
        stack = [node]
        while stack:
            n = stack.pop()
            if isinstance(n, ast.Wildcard):
                return True
            if isinstance(n, ast.Name):
                if n.id in self.lets:
                    if lets[n.id]:
                        return True
                elif n.id not in self.scope:
                    return True
            stack.extend(ast.children(n))
        return False

    def _captures(self) -> dict[str, type]:
        types_: dict[str, type] = {}
        for c in self.rule.captures:
            check_new_name(self.src, c.span, c.name, what="a capture", scope=self.scope, context=self.context)
            if c.name in self.lets:
                raise self.error(c.span, f"'{c.name}' is a let name; a capture declares the type of a variable "
                                         f"of the pattern.")
            if c.name in types_:
                raise self.error(c.span, f"the type of '{c.name}' is declared twice; declare it once.")
            types_[c.name] = self._capture_type(c)
        return types_

    def _capture_type(self, c: ast.Capture) -> type:
        allowed = "int, float, bool, str, torch.dtype or an nn.Module subclass (e.g. nn.Conv2d)"
        if c.type_path[0] not in self.scope:
            raise self.error(c.type_span, f"unknown type '{'.'.join(c.type_path)}' for '{c.name}'; use {allowed}.")
        for attr in c.type_path[1:]:
            check_attribute_name(self.src, c.type_span, attr, self.context)
        try:
            value = self.scope.lookup(c.type_path)
        except PathError as exc:
            raise self.error(c.type_span, str(exc)) from None
        if value in LITERAL_TYPES or (isinstance(value, type) and issubclass(value, torch.nn.Module)):
            return value
        raise self.error(c.type_span, f"'{'.'.join(c.type_path)}' is not a capture type; use {allowed}.")

    def _wildcards(self) -> dict[ast.Span, str]:
        found: list[ast.Span] = []
        stack: list[ast.Expr] = [*(let.value for let in self.rule.lets), self.rule.rewrite.pattern,
                                 self.rule.rewrite.replacement]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Wildcard):
                found.append(node.span)
            stack.extend(ast.children(node))
        return {span: f"_{i}" for i, span in enumerate(sorted(found, key=lambda s: (s.line, s.column)), start=1)}


def compile_rule(rule: ast.RuleDef, src: ast.SourceText, scope: Scope) -> Rule:
    """One rule of a file: compile its pattern, replacement and conditions, then build the
    :class:`Rule` with :meth:`Rule.from_functions` (which traces the pattern)."""
    ctx = _RuleContext(rule, src, scope)
    _check_result_counts(ctx)
    pattern = _Compiler(ctx, "pattern")
    pattern_body = pattern.compile_side(rule.rewrite.pattern)
    params = tuple(pattern.variables)
    replacement = _Compiler(ctx, "replacement", params)
    replacement_body = replacement.compile_side(rule.rewrite.replacement)
    guards = tuple(_guard(ctx, condition, params) for condition in rule.conditions)
    _check_lets_used(ctx, pattern, replacement)
    _check_captures_bound(ctx, params)
    origin = f"{src.name}:{rule.span.line}"
    annotations = {name: ctx.capture_types[name] for name in params if name in ctx.capture_types}
    declarations = _Declarations(ctx, params)
    tolerance, domain = declarations.read()
    return Rule.from_functions(
        _function(f"{rule.name}_pattern", params, pattern_body, annotations, origin),
        _function(f"{rule.name}_replacement", params, replacement_body, annotations, origin),
        name=rule.name,
        where=guards,
        priority=rule.priority,
        doc=rule.doc,
        origin=origin,
        tolerance=tolerance,
        domain=domain,
        numerics=declarations.numerics,
    )


def _check_result_counts(ctx: _RuleContext) -> None:
    """A tuple of patterns needs as many replacements (when the replacement is written as a
    tuple too; a call may return a tuple, which only the rewrite can check)."""
    pattern, replacement = ctx.rule.rewrite.pattern, ctx.rule.rewrite.replacement
    sequences = (ast.TupleExpr, ast.ListExpr)
    n_pattern = len(pattern.elts) if isinstance(pattern, sequences) else 1
    if isinstance(replacement, sequences) and len(replacement.elts) != n_pattern:
        raise ctx.error(replacement.span, f"the pattern has {n_pattern} result(s) but the replacement has "
                                          f"{len(replacement.elts)}; give one replacement per pattern result, "
                                          f"in the same order.")
    if isinstance(pattern, sequences) and not pattern.elts:
        raise ctx.error(pattern.span, "the pattern is an empty tuple; a pattern computes at least one result.")


def _check_lets_used(ctx: _RuleContext, *compilers: _Compiler) -> None:
    used = set().union(*(c.used_lets for c in compilers))
    for name, (_, let) in ctx.lets.items():
        if name not in used:
            raise ctx.error(let.span, f"let '{name}' is never used; remove it or use it in the pattern or the "
                                      f"replacement.")


def _check_captures_bound(ctx: _RuleContext, params: Sequence[str]) -> None:
    for c in ctx.rule.captures:
        if c.name not in params:
            raise ctx.error(c.span, f"'{c.name}' is declared as a capture, but the pattern has no variable "
                                    f"'{c.name}' (its variables: {', '.join(params) or 'none'}).")


# ---- tolerance and domain lines ------------------------------------------------------------------


class _Declarations:
    """The ``tolerance`` and ``domain`` lines of a rule, read into the ``tolerance=`` and
    ``domain=`` mappings a Python rule declares. Values are constants, evaluated at load time
    (nothing is called); ``domain conv = nn.Conv2d(3, 8, 3)`` becomes a factory, called only
    when the rule is property-tested."""

    def __init__(self, ctx: _RuleContext, params: Sequence[str]) -> None:
        self.ctx, self.params = ctx, tuple(params)
        self.tolerance: dict[str, Any] = {}
        self.domain: dict[str, Any] = {}
        #: The ``numerics`` line's contract (see fxrewrite.rule.NUMERICS), ``None`` without one.
        self.numerics: str | None = None
        self._lines: dict[tuple[str, ...], int] = {}

    def read(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        for d in self.ctx.rule.declarations:
            if d.kind == "numerics":
                self._numerics(d)
            elif d.kind == "tolerance":
                for setting in d.settings:
                    self._set(("tolerance", setting.name), self._tolerance(setting), setting.span)
            elif d.values is not None:
                self._values_of_literal(d)
            elif d.target is not None:
                self._settings_of_input(d)
            else:
                for setting in d.settings:
                    self._rule_setting(setting)
        return self.tolerance or None, self.domain or None

    def _set(self, key: tuple[str, ...], value: Any, span: ast.Span) -> None:
        if key in self._lines:
            raise self.ctx.error(span, f"{_spelled(key)} is declared twice (lines {self._lines[key]} and {span.line}); "
                                       f"declare it once.")
        self._lines[key] = span.line
        table = self.tolerance if key[0] == "tolerance" else self.domain
        for part in key[1:-1]:
            table = table.setdefault(part, {})
        table[key[-1]] = value
        if key[0] == "domain":
            self._validate_domain(span)

    def _validate_domain(self, span: ast.Span) -> None:
        """Validate the domain read so far at the line that set its last setting: a bad value is
        reported where it is written, as Python rules get it from ``Rule.from_functions``."""
        try:
            Domain.parse(self.domain, where="@")
        except RuleDefinitionError as exc:
            raise self.ctx.error(span, str(exc).removeprefix("@: ")) from None

    def _numerics(self, d: ast.Declaration) -> None:
        if ("numerics",) in self._lines:
            raise self.ctx.error(d.span, f"numerics is declared twice (lines {self._lines[('numerics',)]} and "
                                         f"{d.span.line}); declare it once.")
        self._lines[("numerics",)] = d.span.line
        try:
            self.numerics = parse_numerics(d.target, f"rule '{self.ctx.rule.name}'")
        except RuleDefinitionError:
            raise self.ctx.error(d.span, f"unknown numerics contract '{d.target}'; write 'numerics tolerance', "
                                         f"'numerics bitwise', 'numerics ulp K' (K a whole number) or "
                                         f"'numerics as_precise'.") from None
        if self.numerics not in (None, "tolerance") and any(x.kind == "tolerance" for x in self.ctx.rule.declarations):
            spelled = str(d.target).replace(":", " ")
            raise self.ctx.error(d.span, f"numerics {spelled} and a tolerance line both say how close is close "
                                         f"enough; keep one (a tolerance goes with 'numerics tolerance').")

    def _tolerance(self, setting: ast.Setting) -> float:
        if setting.name not in TOLERANCE_SETTINGS:
            raise self.ctx.error(setting.span, _unknown_setting(setting.name, "tolerance", TOLERANCE_SETTINGS))
        value = self._constant(setting.value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise self.ctx.error(setting.value.span, f"tolerance {setting.name} must be a number >= 0, got {value!r}.")
        return value

    def _rule_setting(self, setting: ast.Setting) -> None:
        name = setting.name
        if name in DOMAIN_SETTINGS:
            self._set(("domain", name), self._constant(setting.value), setting.span)
        elif name in self.params and self.ctx.kind(name) == "module":
            self._set(("domain", "modules", name), self._factory(setting), setting.span)
        else:
            modules = [p for p in self.params if self.ctx.kind(p) == "module"]
            extra = f", or a module capture of the rule ({', '.join(modules)})" if modules else ""
            raise self.ctx.error(setting.span, _unknown_setting(name, "domain", DOMAIN_SETTINGS, extra))

    def _settings_of_input(self, d: ast.Declaration) -> None:
        name = d.target or ""
        if name not in self.params or self.ctx.kind(name) != "tensor":
            raise self.ctx.error(d.span, f"'domain {name}: ...' sets how the tensor input '{name}' is drawn, but "
                                         f"the rule has no tensor variable '{name}' (its tensor variables: "
                                         f"{', '.join(self._of_kind('tensor')) or 'none'}).")
        for setting in d.settings:
            if setting.name not in INPUT_SETTINGS:
                raise self.ctx.error(setting.span, _unknown_setting(setting.name, f"domain {name}:", INPUT_SETTINGS))
            self._set(("domain", "inputs", name, setting.name), self._constant(setting.value), setting.span)

    def _values_of_literal(self, d: ast.Declaration) -> None:
        name = d.target or ""
        if name not in self.params or self.ctx.kind(name) != "literal":
            raise self.ctx.error(d.span, f"'domain {name} in (...)' lists the values of a literal capture, but "
                                         f"'{name}' is not one (the rule's literal captures: "
                                         f"{', '.join(self._of_kind('literal')) or 'none'}; declare one with "
                                         f"'where {name}: int').")
        values = self._constant(d.values) if d.values is not None else None
        if not isinstance(values, (tuple, list)) or not values:
            raise self.ctx.error(d.span, f"'domain {name} in ...' needs a non-empty tuple or list of values, "
                                         f"got {values!r}.")
        self._set(("domain", "literals", name), tuple(values), d.span)

    def _of_kind(self, kind: str) -> list[str]:
        return [p for p in self.params if self.ctx.kind(p) == kind and not p.startswith("_")]

    def _constant(self, expr: ast.Expr) -> Any:
        return _Compiler(self.ctx, "declaration", ()).compile_side(expr)(_Frame({}))

    def _factory(self, setting: ast.Setting) -> Callable[..., Any]:
        """``domain bn = nn.BatchNorm2d(conv.out_channels)``: a factory that may read the rule's
        other module captures; it names those it reads, and the checker builds them first and
        passes them (fxrewrite.domain.DependentFactory)."""
        others = [p for p in self.params if p != setting.name and self.ctx.kind(p) == "module"]
        compiler = _Compiler(self.ctx, "module", others)
        body = compiler.compile_side(setting.value)
        text = f"{setting.name} = ... ({self.ctx.src.name}:{setting.span.line})"
        return _ModuleFactory(body, text, tuple(compiler.variables))


class _ModuleFactory:
    """``domain conv = nn.Conv2d(...)``: builds the module each time the property test asks. Its
    signature names the other module captures the line reads (keyword-only, no default), which
    is how fxrewrite.domain.factory_needs knows to draw them first."""

    def __init__(self, body: Closure, text: str, needs: tuple[str, ...] = ()) -> None:
        self._body, self._text, self._needs = body, text, needs
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in needs])

    def __call__(self, **modules: Any) -> Any:
        missing = [name for name in self._needs if name not in modules]
        if missing:
            raise TypeError(f"the module factory 'domain {self._text}' builds its module from the module "
                            f"drawn for {', '.join(repr(m) for m in missing)}; pass it by name")
        return self._body(_Frame({name: modules[name] for name in self._needs}))

    def __repr__(self) -> str:
        return f"<module factory 'domain {self._text}'>"


def _spelled(key: tuple[str, ...]) -> str:
    kind, *path = key
    if path[:1] == ["inputs"]:
        return f"'domain {path[1]}: {path[2]}'"
    if path[:1] in (["literals"], ["modules"]):
        return f"the domain of '{path[1]}'"
    return f"'{kind} {path[0]}'"


def _unknown_setting(name: str, line: str, known: Sequence[str], extra: str = "") -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return f"'{name}' is not a setting of a '{line}' line; use one of {', '.join(known)}{extra}.{hint}"


# ---- generated functions -------------------------------------------------------------------------

_TEMPLATE = "def _fxr({params}):\n    return _evaluate({params})\n"


class _Frame:
    """The values of a rule's variables during one evaluation, and the lets computed so far."""

    __slots__ = ("lets", "sizes", "values")

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.lets: dict[str, Any] = {}
        #: id of a tuple or list seen -> (the container, its element count, its nesting depth)
        self.sizes: dict[int, tuple[Any, int, int]] = {}

    def measure(self, value: Any) -> tuple[int, int]:
        """How many elements a tuple or list holds counting nested ones (as torch.fx walks it:
        a container reachable twice counts twice) and how deeply it nests. Each container is
        measured once per evaluation, so lets that nest one container in the next stay linear.

        >>> frame = _Frame({})
        >>> a = [1, 2]
        >>> frame.measure([a, a, (a,)])
        (10, 3)
        """
        stack: list[tuple[Any, bool]] = [(value, False)]
        while stack:
            item, expanded = stack.pop()
            if id(item) in self.sizes:
                continue
            children = [e for e in item if isinstance(e, (tuple, list))]
            if not expanded and children:
                stack.append((item, True))
                stack.extend((c, False) for c in children if id(c) not in self.sizes)
                continue
            size = len(item) + sum(self.sizes[id(c)][1] for c in children)
            depth = 1 + max((self.sizes[id(c)][2] for c in children), default=0)
            self.sizes[id(item)] = (item, size, depth)
        return self.sizes[id(value)][1:]


#: :func:`_function` compiles the template once per parameter list and gives each rule's function
#: that code under the rule's own file name (``CodeType.replace``): compiling it anew for every
#: side of every rule was most of building the functions. ``False`` is the slow twin (compile and
#: ``exec`` the template per function); ``tests/dsl/test_dsl_compile.py`` checks both make the same
#: function, code object field by field.
SHARED_TEMPLATE_CODE = True

_template_codes: dict[tuple[str, ...], types.CodeType] = {}


def _template_code(params: tuple[str, ...]) -> types.CodeType:
    """The code of the template's function for ``params`` (already checked to be identifiers)."""
    code = _template_codes.get(params)
    if code is None:
        module = compile(_TEMPLATE.format(params=", ".join(params)), "<fxrewrite rule>", "exec")
        code = _template_codes[params] = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    return code


def _function(name: str, params: Sequence[str], body: Closure, annotations: Mapping[str, type],
              origin: str) -> Callable[..., Any]:
    """A real function with the rule's variables as parameters (torch.fx reads them from its code
    object) whose body evaluates ``body``. The only text put into the template is the parameter
    list, and every parameter is checked to be a plain identifier first."""
    for p in params:
        if not p.isidentifier() or keyword.iskeyword(p) or p in _TEMPLATE_NAMES:
            raise RuleDefinitionError(f"{origin}: '{p}' cannot be a parameter name; rename the variable "
                                      f"to a plain identifier.")

    def evaluate(*values: Any) -> Any:
        return body(_Frame(dict(zip(params, values))))

    namespace: dict[str, Any] = {"__builtins__": {}, "_evaluate": evaluate}
    filename = f"<fxrewrite rule {origin}>"
    if SHARED_TEMPLATE_CODE:
        fn = namespace["_fxr"] = types.FunctionType(_template_code(tuple(params)).replace(co_filename=filename),
                                                     namespace, "_fxr")  # bound where exec binds it
    else:
        exec(compile(_TEMPLATE.format(params=", ".join(params)), filename, "exec"), namespace)
        fn = namespace["_fxr"]
    fn.__name__ = fn.__qualname__ = name
    fn.__annotations__ = dict(annotations)
    return fn


class MatchView(Protocol):
    """What a where condition reads of a match: ``match[name]`` is a view of a tensor variable
    (with the :data:`GUARD_TENSOR_ATTRIBUTES`), a literal capture's value or a module capture's
    module. :class:`fxrewrite.match.Match` is one; the DSL needs nothing else of it."""

    def __getitem__(self, name: str) -> Any: ...


class _WhereGuard:
    """A ``where`` condition as a guard: ``guard(match) -> bool``."""

    def __init__(self, body: Closure, names: Sequence[str], label: str) -> None:
        self._body = body
        self._names = tuple(names)
        self.__name__ = self.__qualname__ = label  # what rewrite reports name the guard by

    def __call__(self, match: MatchView) -> bool:
        return bool(self._body(_Frame({name: match[name] for name in self._names})))

    def __repr__(self) -> str:
        return f"<guard {self.__qualname__}>"


def _guard(ctx: _RuleContext, condition: ast.Condition, params: Sequence[str]) -> _WhereGuard:
    compiler = _Compiler(ctx, "where", params)
    body = compiler.compile_side(condition.expr)
    label = f"'where {condition.text}' ({ctx.src.name}:{condition.span.line})"
    return _WhereGuard(body, tuple(compiler.variables), label)


# ---- expressions ---------------------------------------------------------------------------------


class _CompilerBase:
    """What the compilers of one side of a rule share: the side, the variables found, the lets
    used, and the walk that orders them; :meth:`compile` dispatches on the node's type to a
    ``_<node type>`` method of the subclasses (:class:`_NameCompiler` for names, attributes and
    paths; :class:`_ExpressionCompiler` for calls, operators, containers and literals)."""

    def __init__(self, ctx: _RuleContext, side: str, params: Sequence[str] | None = None) -> None:
        self.ctx = ctx
        self.side = side
        self.params = params
        self.variables: dict[str, None] = {}
        self.used_lets: set[str] = set()

    def compile_side(self, node: ast.Expr) -> Closure:
        """The closure computing this side's expression ``node``. The lets it uses, directly or
        through other lets, are each compiled once and evaluated once per call, in the order
        their evaluation would finish (every let after the lets it uses), before ``node``
        itself: no closure calls another let's closure, so neither compiling nor evaluating
        nests deeper than one expression, however many lets a rule chains."""
        order = self._walk(node)
        lets = [(name, self.compile(self.ctx.lets[name][1].value, self.ctx.lets[name][0])) for name in order]
        body = self.compile(node)
        if not lets:
            return body

        def evaluate(frame: _Frame) -> Any:
            for name, let_body in lets:
                frame.lets[name] = let_body(frame)
            return body(frame)

        return evaluate

    def _walk(self, root: ast.Expr) -> list[str]:
        """Walk ``root`` as Python would evaluate it, following each let at its first use:
        records the pattern's variables in the order of their first use, and returns the lets
        used, each after the lets it uses. Linear in the size of the rule (each let once)."""
        follow_lets = self.side in ("pattern", "replacement")  # elsewhere lets are refused when compiled
        followed: set[str] = set()
        order: list[str] = []
        stack: list[ast.Expr | str] = [root]
        while stack:
            item = stack.pop()
            if isinstance(item, str):  # the value of the let ``item`` has been walked
                order.append(item)
            elif isinstance(item, ast.Name) and item.id in self.ctx.lets:
                if follow_lets and item.id not in followed:
                    followed.add(item.id)
                    stack += [item.id, self.ctx.lets[item.id][1].value]
            elif isinstance(item, ast.Name):
                if self.side == "pattern" and item.id not in self.ctx.scope:
                    self.variables.setdefault(item.id)
            elif isinstance(item, ast.Wildcard):
                if self.side == "pattern":
                    self.variables.setdefault(self.ctx.wildcards[item.span])
            else:
                stack.extend(reversed(ast.children(item)))
        self.used_lets.update(order)
        return order

    def compile(self, node: ast.Expr, visible_lets: int | None = None) -> Closure:
        visible = len(self.ctx.rule.lets) if visible_lets is None else visible_lets
        method = getattr(self, f"_{type(node).__name__.lower()}")
        return method(node, visible)

    def _all(self, nodes: Sequence[ast.Expr], visible: int) -> list[Closure]:
        return [self.compile(n, visible) for n in nodes]

    def _side_name(self) -> str:
        return {"pattern": "pattern", "replacement": "replacement", "where": "where condition",
                "declaration": "tolerance or domain value", "module": "module a domain line builds"}[self.side]


class _NameCompiler(_CompilerBase):
    """Names, attributes and dotted paths: which a side may read (a let, a name in scope, a
    variable the pattern binds), each checked when compiled."""

    def _name(self, node: ast.Name, visible: int) -> Closure:
        name = node.id
        if name in self.ctx.lets:
            return self._let(node, visible)
        if name in self.ctx.scope:
            return self._path(((name, node.span),))
        return self._variable(node)

    def _wildcard(self, node: ast.Wildcard, visible: int) -> Closure:
        if self.side != "pattern":
            raise self.ctx.error(node.span, f"'_' matches anything, so it can only be used in the pattern; "
                                            f"name the variable to use it in the {self._side_name()}.")
        name = self.ctx.wildcards[node.span]
        self.variables.setdefault(name)
        return lambda frame: frame.values[name]

    def _let(self, node: ast.Name, visible: int) -> Closure:
        index, let = self.ctx.lets[node.id]
        if index >= visible:
            raise self.ctx.error(node.span, f"'{node.id}' is used before its let line (line {let.span.line}); "
                                            f"a let can only use the lets above it.")
        if self.side == "where":
            raise self.ctx.error(node.span, f"'{node.id}' is a let name; a where condition can read only the "
                                            f"pattern's variables and captures.")
        if self.side in _DECLARATION_SIDES:
            raise self.ctx.error(node.span, f"'{node.id}' is a let name; a {self._side_name()} cannot use lets, "
                                            f"only constants and names in scope.")
        name = node.id
        return lambda frame: frame.lets[name]  # computed before the side's expression (compile_side)

    def _variable(self, node: ast.Name) -> Closure:
        name = node.id
        check_new_name(self.ctx.src, node.span, name, what="a variable", scope=None, context=self.ctx.context)
        if not name[0].islower():
            raise self.ctx.error(node.span, self._unknown_name(name))
        if self.side == "declaration" or (self.side == "module" and name not in (self.params or ())):
            raise self.ctx.error(node.span, self._unreadable_variable(name))
        if self.side == "pattern":
            self.variables.setdefault(name)
        elif name not in (self.params or ()):
            raise self.ctx.error(node.span, f"the {self._side_name()} uses '{name}', which the pattern does not "
                                            f"bind (the pattern's variables: "
                                            f"{', '.join(self.params or ()) or 'none'}).")
        else:
            self.variables.setdefault(name)
        return lambda frame: frame.values[name]

    def _unreadable_variable(self, name: str) -> str:
        what = (f"a {self._side_name()} is built from constants and names in scope; it cannot read '{name}' "
                f"(not a name in scope, so a variable of the rule)")
        if self.side != "module":
            return what + "."
        if self.ctx.kind(name) == "module":  # only the capture the line builds is left out of params
            return (f"the {self._side_name()} cannot read '{name}', the module it builds; build it from constants "
                    f"or from the rule's other module captures.")
        return (f"{what}; besides those it may read the rule's other module captures "
                f"({', '.join(self.params or ()) or 'this rule has none'}).")

    def _unknown_name(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self.ctx.scope.roots), n=3)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        return (f"unknown name '{name}': it is not in scope ({shown(self.ctx.scope.roots)}), and only names "
                f"starting with a lower-case letter are variables. Pass it with names= or add a 'use' line.{hint}")

    # -- attributes and paths ----------------------------------------------------------------
    def _attribute(self, node: ast.Attribute, visible: int) -> Closure:
        check_attribute_name(self.ctx.src, node.attr_span, node.attr, self.ctx.context)
        path = self._scope_path(node)
        if path is not None:
            return self._path(path)
        if isinstance(node.value, ast.Literal):
            raise self.ctx.error(node.attr_span, f"attributes of a literal ({node.value.value!r}.{node.attr}) "
                                                 f"cannot be read in rule files; write the value it stands for.")
        self._check_receiver(node)
        receiver, attr = self.compile(node.value, visible), node.attr
        return lambda frame: getattr(receiver(frame), attr)

    def _scope_path(self, node: ast.Expr) -> tuple[tuple[str, ast.Span], ...] | None:
        """``((name, span), (attr, span), ...)`` when ``node`` is a dotted path from a name in scope."""
        parts: list[tuple[str, ast.Span]] = []
        while isinstance(node, ast.Attribute):
            parts.append((node.attr, node.attr_span))
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.ctx.scope and node.id not in self.ctx.lets:
            parts.append((node.id, node.span))
            return tuple(reversed(parts))
        return None

    def _path(self, path: tuple[tuple[str, ast.Span], ...]) -> Closure:
        names = tuple(name for name, _ in path)
        for name, span in path[1:]:
            check_attribute_name(self.ctx.src, span, name, self.ctx.context)
        try:
            self.ctx.scope.check(names, defer_ops=self.side != "pattern")
        except PathError as exc:
            raise self.ctx.error(path[exc.index][1], str(exc)) from None
        scope, src = self.ctx.scope, self.ctx.src

        def resolve(frame: _Frame) -> Any:
            try:
                return scope.lookup(names)
            except PathError as exc:
                raise _runtime_error(src, path[exc.index][1], str(exc)) from None

        return resolve

    def _check_receiver(self, node: ast.Attribute) -> None:
        """Attributes of a variable: tensor attributes (TensorView ones in a where condition);
        none of a module capture in the pattern, where it can only be called."""
        if not isinstance(node.value, ast.Name) or node.value.id in self.ctx.lets:
            return
        name, attr, kind = node.value.id, node.attr, self.ctx.kind(node.value.id)
        if not name[0].islower() or name in RESERVED_WORDS or keyword.iskeyword(name):
            return  # not a variable at all: compiling the name says so
        if kind == "tensor" and self.side == "where" and attr not in GUARD_TENSOR_ATTRIBUTES:
            raise self.ctx.error(node.attr_span, f"a where condition sees tensor '{name}' through its shape, dtype "
                                                 f"and device: use one of "
                                                 f"{', '.join(sorted(GUARD_TENSOR_ATTRIBUTES))}, "
                                                 f"not '{attr}'.")
        if kind == "tensor" and self.side != "where" and not hasattr(torch.Tensor, attr):
            raise self.ctx.error(node.attr_span, f"'{name}' is a tensor variable and torch.Tensor has no attribute "
                                                 f"'{attr}'. If '{name}' was meant to be a module or function, it "
                                                 f"is not in scope: pass it with names= or add a 'use' line.")
        if kind != "tensor" and self.side == "pattern":
            raise self.ctx.error(node.attr_span, f"the pattern reads '{name}.{attr}', but a {kind} capture "
                                                 f"cannot be inspected in the pattern; read it in the replacement "
                                                 f"or in a where condition.")


class _ExpressionCompiler(_CompilerBase):
    """Calls, operators, containers and literals: what each side may compute with them."""

    def _call(self, node: ast.Call, visible: int) -> Closure:
        self._check_callee(node)
        func = self.compile(node.func, visible)
        args = self._all(node.args, visible)
        keywords = [(k.name, self.compile(k.value, visible)) for k in node.keywords]
        if self.side == "pattern" and not self.ctx.mentions_variable(node):  # after a refused callee is named
            raise self.ctx.error(node.span, "a pattern can only call functions on its variables, and this call "
                                            "uses none; write the constant it stands for, or move it to the "
                                            "replacement.")
        src, span = self.ctx.src, node.span

        def call(frame: Any) -> Any:
            fn, values = func(frame), [a(frame) for a in args]
            problem = _huge_result(fn, values)
            if problem:
                raise _runtime_error(src, span, problem)
            return fn(*values, **{k: v(frame) for k, v in keywords})

        return call

    def _check_callee(self, node: ast.Call) -> None:
        func = node.func
        if self.side == "declaration":
            raise self.ctx.error(node.span, "tolerance and domain values are constants (numbers, strings, True, "
                                            "False, None, names like torch.float32, tuples and lists of them); "
                                            "nothing is called. To say how to build a module capture, write "
                                            "'domain conv = nn.Conv2d(3, 8, 3)'.")
        if isinstance(func, ast.Name) and func.id not in self.ctx.lets and func.id not in self.ctx.scope:
            check_new_name(self.ctx.src, func.span, func.id, what="a function", scope=None, context=self.ctx.context)
            kind = self.ctx.kind(func.id)
            if kind == "literal":
                raise self.ctx.error(func.span, f"'{func.id}' is a literal capture and cannot be called; only "
                                                f"module captures (e.g. 'where {func.id}: nn.Linear') can.")
            if kind != "module":
                raise self.ctx.error(func.span, f"unknown function '{func.id}': a called name must be in scope "
                                                f"({shown(self.ctx.scope.roots)}), given with names= or a 'use' "
                                                f"line, or be a module capture declared like "
                                                f"'where {func.id}: nn.Linear'.")
        if isinstance(func, ast.Literal):
            raise self.ctx.error(func.span, f"{func.value!r} is not a function; is an operator missing before "
                                            f"the '('?")

    # -- operators ---------------------------------------------------------------------------
    def _binop(self, node: ast.BinOp, visible: int) -> Closure:
        left, right = self.compile(node.left, visible), self.compile(node.right, visible)
        apply, check = _binary(node.op, self.ctx.src, node.span), self._container_check(node.span)
        return lambda frame: check(frame, apply(left(frame), right(frame)))

    def _unaryop(self, node: ast.UnaryOp, visible: int) -> Closure:
        operand = self.compile(node.operand, visible)
        fn = operator.neg if node.op == "-" else operator.pos
        return lambda frame: fn(operand(frame))

    def _compare(self, node: ast.Compare, visible: int) -> Closure:
        if self.side != "where" and (len(node.ops) > 1 or node.ops[0] not in _TENSOR_COMPARISONS):
            what = "chained comparisons" if len(node.ops) > 1 else f"'{node.ops[0]}'"
            raise self.ctx.error(node.span, f"{what} can only be used in where conditions; in a "
                                            f"{self._side_name()} compare two values with == != < <= > >=.")
        operands = self._all((node.left, *node.comparators), visible)
        fns = [_COMPARISONS[op] for op in node.ops]
        if len(fns) == 1:
            fn, (left, right) = fns[0], operands
            return lambda frame: fn(left(frame), right(frame))

        def chain(frame: _Frame) -> Any:
            left = operands[0](frame)
            for fn, operand in zip(fns, operands[1:]):
                right = operand(frame)
                if not fn(left, right):
                    return False
                left = right
            return True

        return chain

    def _boolop(self, node: ast.BoolOp, visible: int) -> Closure:
        self._where_only(node, f"'{node.op}'", f"use torch.logical_{node.op}(a, b)")
        values = self._all(node.values, visible)
        if node.op == "and":
            return lambda frame: all(v(frame) for v in values)
        return lambda frame: any(v(frame) for v in values)

    def _not(self, node: ast.Not, visible: int) -> Closure:
        self._where_only(node, "'not'", "use torch.logical_not(a)")
        operand = self.compile(node.operand, visible)
        return lambda frame: not operand(frame)

    def _where_only(self, node: ast.Expr, what: str, instead: str) -> None:
        if self.side != "where":
            raise self.ctx.error(node.span, f"{what} can only be used in where conditions; in a "
                                            f"{self._side_name()}, {instead}.")

    # -- containers and literals -------------------------------------------------------------
    def _subscript(self, node: ast.Subscript, visible: int) -> Closure:
        value, index = self.compile(node.value, visible), self.compile(node.index, visible)
        return lambda frame: value(frame)[index(frame)]

    def _slice(self, node: ast.Slice, visible: int) -> Closure:
        parts = [self.compile(p, visible) if p is not None else None for p in (node.start, node.stop, node.step)]
        return lambda frame: slice(*(p(frame) if p is not None else None for p in parts))

    def _tupleexpr(self, node: ast.TupleExpr, visible: int) -> Closure:
        elts, check = self._all(node.elts, visible), self._container_check(node.span)
        return lambda frame: check(frame, tuple(e(frame) for e in elts))

    def _listexpr(self, node: ast.ListExpr, visible: int) -> Closure:
        elts, check = self._all(node.elts, visible), self._container_check(node.span)
        return lambda frame: check(frame, [e(frame) for e in elts])

    def _container_check(self, span: ast.Span) -> Callable[[_Frame, Any], Any]:
        """A check that a tuple or list a rule builds stays small and shallow: lets can nest one
        in the next, and torch.fx would walk the (exponentially large) tree."""
        src = self.ctx.src

        def check(frame: _Frame, value: Any) -> Any:
            if isinstance(value, (tuple, list)):
                size, depth = frame.measure(value)
                if size > _MAX_CONSTANT_LENGTH:
                    raise _runtime_error(src, span, f"this tuple or list would hold {size} elements counting nested "
                                                    f"ones; at most {_MAX_CONSTANT_LENGTH} are allowed.")
                if depth > MAX_DEPTH:
                    raise _runtime_error(src, span, f"tuples and lists nested {depth} levels deep; at most "
                                                    f"{MAX_DEPTH} are allowed.")
            return value

        return check

    def _literal(self, node: ast.Literal, visible: int) -> Closure:
        value = node.value
        return lambda frame: value


class _Compiler(_NameCompiler, _ExpressionCompiler):
    """Compiles the expressions of one side of a rule (``pattern``, ``replacement`` or ``where``)
    into closures over a :class:`_Frame`, checking every name and attribute on the way.

    The pattern compiler records the rule's variables in the order Python would first evaluate
    them (a callee before its arguments, left to right); the other sides may only read those.
    """


# ---- operator semantics --------------------------------------------------------------------------

_BINARY: Mapping[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
    "@": operator.matmul,
}

_TENSOR_COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">="})

_COMPARISONS: Mapping[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
    "is": operator.is_,
    "is not": operator.is_not,
}


def _binary(op: str, src: ast.SourceText, span: ast.Span) -> Callable[[Any, Any], Any]:
    """``a op b``, refusing constant arithmetic whose result would be huge (a rule file must not
    be able to make loading it hang: ``9 ** 9 ** 9``)."""
    fn = _BINARY[op]

    def apply(a: Any, b: Any) -> Any:
        problem = _constant_problem(op, a, b)
        if problem:
            raise _runtime_error(src, span, problem)
        return fn(a, b)

    return apply


def _huge_result(fn: Any, args: list[Any]) -> str | None:
    """Refuse ``math.factorial``/``comb``/``perm`` calls whose result would be huge (estimated
    before computing it: ``math.comb(10**7, 5 * 10**6)`` takes minutes and no op takes it)."""
    if not any(fn is f for f in (math.factorial, math.comb, math.perm)) or not args:
        return None  # by identity: ``fn`` may be a Proxy, whose == records a node
    if not all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return None
    n = args[0]
    k = min(args[1] if len(args) > 1 else n, n)
    if n <= 1 or k <= 0:
        return None
    log_result = math.lgamma(n + 1) - math.lgamma(n - k + 1) - (math.lgamma(k + 1) if fn is math.comb else 0.0)
    bits = int(log_result / math.log(2))
    if bits <= _MAX_CONSTANT_BITS:
        return None
    return (f"math.{fn.__name__}{tuple(args)} would have about {bits} bits; at most {_MAX_CONSTANT_BITS} are "
            f"allowed: write a smaller constant.")


def _constant_problem(op: str, a: Any, b: Any) -> str | None:
    sequences = (str, bytes, tuple, list)
    if isinstance(a, int) and isinstance(b, int):
        bits = a.bit_length() * b if op == "**" and b > 0 else a.bit_length() + b.bit_length()
        if op in ("**", "*") and bits > _MAX_CONSTANT_BITS:
            return (f"the constant {op!r} would have about {bits} bits; at most {_MAX_CONSTANT_BITS} are allowed: "
                    f"write a smaller constant.")
    if op == "*" and isinstance(a, sequences) != isinstance(b, sequences):
        seq, n = (a, b) if isinstance(a, sequences) else (b, a)
        if isinstance(n, int) and len(seq) * n > _MAX_CONSTANT_LENGTH:
            return (f"repeating a sequence {n} times would make more than {_MAX_CONSTANT_LENGTH} elements, which "
                    f"rule files do not allow; write a shorter sequence.")
    if op == "+" and isinstance(a, sequences) and isinstance(b, sequences):
        if len(a) + len(b) > _MAX_CONSTANT_LENGTH:
            return f"the constant would be longer than {_MAX_CONSTANT_LENGTH}; write a shorter one."
    if op == "%" and isinstance(a, (str, bytes)):
        return "'%' formatting of strings is not allowed in rule files; write the string itself."
    return None
