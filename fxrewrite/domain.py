"""What a rule declares about where it holds: its ``domain`` (which inputs it is meant for:
:class:`Domain`, :class:`TensorDomain`, the keys in :data:`DOMAIN_KEYS`) and its ``tolerance``
(:class:`Tolerance`). Both are frozen values, validated when the rule is built, so that a
misspelt key fails at the rule's definition with its name, ``file:line`` and the key meant:

>>> import torch
>>> Domain.parse({"dtypez": (torch.float32,)}, where="rule 'r' (rules.py:3)")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
fxrewrite.errors.RuleDefinitionError: rule 'r' (rules.py:3): unknown domain key(s) ['dtypez'] (did you mean ...?); ...

This is the one module that says what a domain means; the property checker
(:mod:`fxrewrite.testing`) draws inputs from it and :mod:`fxrewrite.analysis` probes rules
with it. A declaration is still read like the dict it was written as
(``rule.domain["literals"]``, ``dict(rule.domain)``): the mapping is what was declared, the
attributes are the values in effect, defaults filled in. Importing this module imports neither
pytest nor hypothesis.
"""

from __future__ import annotations

import difflib
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs
import torch

from .errors import RuleDefinitionError
from .verify import default_tolerance

__all__ = ["DEFAULT_DTYPES", "DOMAIN_KEYS", "INPUT_KEYS", "TOLERANCE_KEYS", "DependentFactory", "Domain", "ShapeMode",
           "TensorDomain", "Tolerance", "build_order", "check_option", "factory_needs"]

#: Tensor dtypes drawn when a rule's domain does not say (add float16/bfloat16 in ``domain``).
DEFAULT_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool,
)

#: The keys of a rule's ``domain`` declaration and what each one means.
DOMAIN_KEYS: Mapping[str, str] = {
    "dtypes": "tensor dtypes to draw, most important first (default: float32, float64, int64, int32, "
              "uint8, bool); dtypes the pattern rejects are left out automatically",
    "ranks": "(min, max) number of dimensions of the largest tensor (default (0, 4))",
    "sides": "(min, max) size of each dimension (default (1, 3))",
    "shapes": "'broadcast' (default): tensors may differ by size-1 and missing dimensions; "
              "'equal': all tensor arguments have one shape",
    "mixed_dtypes": "tensor arguments may have different dtypes (default True)",
    "non_contiguous": "also draw non-contiguous tensors (default True)",
    "min_value": "smallest finite value drawn (default: the dtype's smallest)",
    "max_value": "largest finite value drawn (default: the dtype's largest)",
    "special_values": "also draw nan, inf and -inf (default True)",
    "literals": "{name: sequence of values or a strategy} for literal captures",
    "modules": "{name: factory or strategy} for module captures; a factory's parameters without defaults "
               "name other module captures and receive the modules drawn for them",
    "inputs": "{name: {dtypes, min_value, max_value, special_values, shape}} for one tensor argument",
}

#: The keys of ``domain['inputs'][name]``: how one tensor argument is drawn.
INPUT_KEYS: tuple[str, ...] = ("dtypes", "min_value", "max_value", "special_values", "shape")
#: The keys of a ``tolerance`` declaration.
TOLERANCE_KEYS: tuple[str, ...] = ("rtol", "atol")
ShapeMode = Literal["broadcast", "equal"]


def _check_keys(declared: Mapping[str, Any], allowed: Iterable[str], what: str, where: str,
                fix: str | None = None) -> None:
    """Raise for keys of ``declared`` not in ``allowed``, with the closest allowed key as a guess;
    ``fix`` ends the message (default: the list of keys)."""
    known = set(allowed)
    unknown_keys = declared.keys() - known
    if unknown_keys:  # (the message's sorting only when there is one to write)
        allowed = sorted(known)
        unknown = sorted(str(k) for k in unknown_keys)
        guesses = [g for k in unknown for g in difflib.get_close_matches(k, allowed, n=1)]
        hint = f" (did you mean {', '.join(repr(g) for g in guesses)}?)" if guesses else ""
        fix = fix if fix is not None else f"the keys are {allowed} (see fxrewrite.testing.DOMAIN_KEYS)"
        raise RuleDefinitionError(f"{where}: unknown {what} key(s) {unknown}{hint}; {fix}.")


def _is_strategy(value: Any) -> bool:
    """A Hypothesis strategy (only a program that imported hypothesis can hold one)."""
    strategies = sys.modules.get("hypothesis.strategies")
    return strategies is not None and isinstance(value, strategies.SearchStrategy)


def _pair(value: Any, key: str, where: str) -> tuple[int, int]:
    ok = (isinstance(value, (tuple, list)) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value) and value[0] <= value[1])
    if not ok:
        raise RuleDefinitionError(f"{where}: domain['{key}'] must be a (min, max) pair of integers >= 0, "
                                  f"min <= max; got {value!r}.")
    return (value[0], value[1])


def _dtypes(value: Any, key: str, where: str) -> tuple[torch.dtype, ...]:
    try:
        values = (value,) if isinstance(value, torch.dtype) else tuple(value)
    except TypeError:
        values = ()
    if not values or not all(isinstance(v, torch.dtype) for v in values):
        raise RuleDefinitionError(f"{where}: {key} must be a non-empty sequence of torch dtypes, e.g. "
                                  f"(torch.float32, torch.float64); got {value!r}.")
    return values


def _number(value: Any, key: str, where: str) -> float | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise RuleDefinitionError(f"{where}: {key} must be a number or None, got {value!r}.")
    return value


def _flag(value: Any, key: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise RuleDefinitionError(f"{where}: {key} must be True or False, got {value!r}.")
    return value


def _is_shape(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                    for v in value)


@attrs.frozen
class TensorDomain:
    """How one tensor argument's values are drawn (``domain['inputs'][name]`` over the rule's
    own settings)."""

    dtypes: tuple[torch.dtype, ...] | None
    min_value: float | None
    max_value: float | None
    special_values: bool
    shape: tuple[int, ...] | None = None


def _input_domain(name: str, own: Any, where: str) -> Mapping[str, Any]:
    key = f"domain['inputs']['{name}']"
    if not isinstance(own, Mapping):
        raise RuleDefinitionError(f"{where}: {key} must be a dict, got {own!r}.")
    _check_keys(own, INPUT_KEYS, key, where)
    if "dtypes" in own:
        _dtypes(own["dtypes"], f"{key}['dtypes']", where)
    for bound in ("min_value", "max_value"):
        _number(own.get(bound), f"{key}['{bound}']", where)
    if "special_values" in own:
        _flag(own["special_values"], f"{key}['special_values']", where)
    if "shape" in own and not _is_shape(own["shape"]):
        raise RuleDefinitionError(f"{where}: {key}['shape'] must be a tuple of sizes, e.g. () or (2, 3); "
                                  f"got {own['shape']!r}.")
    return dict(own)


def _literal_values(name: str, values: Any, where: str) -> Any:
    if isinstance(values, (tuple, list)) and not values:
        raise RuleDefinitionError(f"{where}: domain['literals']['{name}'] lists no value; give at least one "
                                  f"(e.g. (1, 2)) or leave the literal out of the domain.")
    return values


def _module_source(name: str, source: Any, where: str) -> Any:
    if not (callable(source) or _is_strategy(source)):
        raise RuleDefinitionError(
            f"{where}: domain['modules']['{name}'] must be a zero-argument factory "
            f"(e.g. lambda: nn.Conv2d(3, 4, 3)), a factory of the modules drawn for other captures "
            f"(e.g. lambda conv: nn.BatchNorm2d(conv.out_channels)) or a strategy of modules, got {source!r}.")
    return source


def factory_needs(source: Any) -> tuple[str, ...]:
    """The module captures a ``domain['modules']`` factory names: its parameters without a
    default (it receives the module drawn for each, by name). A strategy, or a factory whose
    signature cannot be read, names none.

    >>> factory_needs(lambda conv, eps=1e-5: None), factory_needs(lambda: None)
    (('conv',), ())
    """
    if _is_strategy(source) or not callable(source):
        return ()
    if isinstance(source, DependentFactory):
        return source.needs
    try:
        parameters = inspect.signature(source).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: called with no argument
        return ()
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in parameters if p.kind in named and p.default is inspect.Parameter.empty)


@attrs.frozen
class DependentFactory:
    """A ``domain['modules']`` factory that names other module captures (``lambda conv:
    nn.BatchNorm2d(conv.out_channels)``): the checker draws those first and passes each, by
    name, so that the modules fit together by construction instead of by luck (a conv and a
    BatchNorm drawn apart matched in a third of the draws). Called without them (as code that
    builds one module at a time does), it builds each from its own factory in ``declared`` first;
    modules given for captures it does not name are ignored, so a caller may pass all it built."""

    make: Callable[..., Any]
    needs: tuple[str, ...]
    declared: Mapping[str, Any] = attrs.field(repr=False)

    def __call__(self, **modules: Any) -> Any:
        for name in self.needs:
            if name not in modules:
                source = self.declared.get(name)
                if not callable(source) or _is_strategy(source):
                    raise TypeError(f"the module factory needs the module drawn for '{name}', which has no "
                                    f"factory of its own to build it from; pass it by name")
                modules[name] = _dependent(source, self.declared)()
        return self.make(**{name: modules[name] for name in self.needs})


def build_order(names: Sequence[str], sources: Mapping[str, Any]) -> list[str]:
    """``names`` (module captures) in the order their modules are built: as given, each whose
    factory names other captures (:class:`DependentFactory`) after those (the domain refuses
    cycles). The checker draws in this order, and the rule analysis builds its modules in it.

    >>> sources = {"bn": DependentFactory(lambda conv: None, ("conv",), {}), "conv": lambda: None}
    >>> build_order(["bn", "conv"], sources)
    ['conv', 'bn']
    """
    order: list[str] = []

    def add(name: str) -> None:
        if name in order:
            return
        source = sources.get(name)
        for needed in source.needs if isinstance(source, DependentFactory) else ():
            add(needed)
        order.append(name)

    for name in names:
        add(name)
    return order


def _dependent(source: Any, declared: Mapping[str, Any]) -> Any:
    needs = factory_needs(source)
    return DependentFactory(source, needs, declared) if needs else source


def _module_sources(modules: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """The declared module sources, each factory that names other captures wrapped in a
    :class:`DependentFactory`; a cycle of factories naming each other is an error."""
    needs = {name: factory_needs(source) for name, source in modules.items()}
    cycle = _cycle(needs)
    if cycle:
        shown = " -> ".join(f"'{n}'" for n in cycle)
        what = (f"the factory of domain['modules']['{cycle[0]}'] names its own capture" if len(cycle) == 2 else
                f"the factories of domain['modules'] name each other in a cycle ({shown})")
        raise RuleDefinitionError(
            f"{where}: {what}, so none of them can be drawn first; make one of them build its module without "
            f"the others (a zero-argument factory).")
    return {name: _dependent(source, modules) for name, source in modules.items()}


def _cycle(needs: Mapping[str, tuple[str, ...]]) -> list[str]:
    """A cycle of names each naming the next in ``needs`` (the first name repeated at the end), or []."""
    done: set[str] = set()

    def visit(path: list[str]) -> list[str]:
        for name in needs.get(path[-1], ()):
            if name in path:
                return [*path[path.index(name):], name]
            if name in needs and name not in done:
                found = visit([*path, name])
                if found:
                    return found
        done.add(path[-1])
        return []

    for name in needs:
        found = visit([name]) if name not in done else []
        if found:
            return found
    return []


def _by_name(key: str, value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RuleDefinitionError(f"{where}: domain['{key}'] must be a dict keyed by parameter name, got {value!r}.")
    check = {"inputs": _input_domain, "literals": _literal_values, "modules": _module_source}[key]
    checked = {name: check(name, v, where) for name, v in value.items()}
    return _module_sources(checked, where) if key == "modules" else checked


def check_option(key: str, value: Any, where: str) -> Any:
    """Validate one ``domain`` setting; return it in its typed form (a dtype tuple, a pair, ...).

    >>> check_option("ranks", [1, 2], "rule 'r'")
    (1, 2)
    """
    _check_keys({key: value}, DOMAIN_KEYS, "domain", where)
    if key == "dtypes":
        return _dtypes(value, "domain['dtypes']", where)
    if key in ("ranks", "sides"):
        pair = _pair(value, key, where)
        if key == "sides" and pair[0] == 0:
            raise RuleDefinitionError(f"{where}: domain['sides'] must start at 1 or more; got {value!r}.")
        return pair
    if key == "shapes":
        if value not in ("broadcast", "equal"):
            raise RuleDefinitionError(f"{where}: domain['shapes'] is 'broadcast' or 'equal', got {value!r}.")
        return value
    if key in ("mixed_dtypes", "non_contiguous", "special_values"):
        return _flag(value, f"domain['{key}']", where)
    if key in ("min_value", "max_value"):
        return _number(value, f"domain['{key}']", where)
    return _by_name(key, value, where)


@attrs.frozen(eq=False)
class Domain(Mapping[str, Any]):
    """A rule's ``domain`` declaration, validated, with defaults filled in.

    Read as a mapping it is what was declared; its attributes are what is in effect.

    >>> d = Domain.parse({"ranks": (1, 2)}, where="rule 'r'")
    >>> d.ranks, d.sides, dict(d), d == {"ranks": (1, 2)}
    ((1, 2), (1, 3), {'ranks': (1, 2)}, True)
    """

    declared: Mapping[str, Any] = attrs.field(factory=dict)
    dtypes: tuple[torch.dtype, ...] = DEFAULT_DTYPES
    ranks: tuple[int, int] = (0, 4)
    sides: tuple[int, int] = (1, 3)
    shapes: ShapeMode = "broadcast"
    mixed_dtypes: bool = True
    non_contiguous: bool = True
    min_value: float | None = None
    max_value: float | None = None
    special_values: bool = True
    literals: Mapping[str, Any] = attrs.field(factory=dict)
    modules: Mapping[str, Any] = attrs.field(factory=dict)
    inputs: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)

    @classmethod
    def parse(cls, declared: Mapping[str, Any] | None, *, where: str) -> Domain:
        """Validate a ``domain`` declaration (a dict, or a :class:`Domain` already parsed);
        errors name the rule (``where``), the key and the fix."""
        if isinstance(declared, Domain):
            return declared
        if declared is not None and not isinstance(declared, Mapping):
            raise RuleDefinitionError(f"{where}: domain= takes a dict such as {{'dtypes': (torch.float32,)}}, "
                                      f"got {declared!r} ({type(declared).__name__}).")
        declared = dict(declared or {})
        _check_keys(declared, DOMAIN_KEYS, "domain", where)
        options = {key: check_option(key, value, where) for key, value in declared.items()}
        return cls(declared, **options)

    def __getitem__(self, key: str) -> Any:
        return self.declared[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.declared)

    def __len__(self) -> int:
        return len(self.declared)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Domain):
            return dict(self.declared) == dict(other.declared)
        return isinstance(other, Mapping) and dict(self.declared) == dict(other)

    __hash__ = None  # type: ignore[assignment]  # a mapping of unhashable values, as the dict it stands for

    def check_names(self, kinds: Mapping[str, str], where: str) -> None:
        """A name in ``literals``, ``modules`` or ``inputs`` that is a parameter of the rule
        (``kinds``: ``{name: "tensor" | "literal" | "module"}``) must be one of that kind, and the
        factories of its module captures may name only module captures. Other names are ignored,
        so that one domain dict can serve several rules."""
        for key, kind in (("literals", "literal"), ("modules", "module"), ("inputs", "tensor")):
            wrong = sorted(name for name in getattr(self, key) if kinds.get(name, kind) != kind)
            if wrong:
                found = ", ".join(f"'{name}' is a {kinds[name]} parameter" for name in wrong)
                raise RuleDefinitionError(
                    f"{where}: domain['{key}'] is for {kind} parameters, but {found}; move it to "
                    f"domain['{_KEY_OF_KIND[kinds[wrong[0]]]}'].")
        self._check_factory_needs(kinds, where)

    def _check_factory_needs(self, kinds: Mapping[str, str], where: str) -> None:
        """The parameters of a module factory of this rule name module captures of the rule."""
        captures = sorted(name for name, kind in kinds.items() if kind == "module")
        for name, source in self.modules.items():
            if kinds.get(name) != "module":
                continue
            for need in factory_needs(source):
                if kinds.get(need) == "module":
                    continue
                what = (f"'{need}' is a {kinds[need]} parameter, drawn after the modules" if need in kinds
                        else f"'{need}' is not a parameter of the rule")
                raise RuleDefinitionError(
                    f"{where}: the factory of domain['modules']['{name}'] takes '{need}', but a factory's "
                    f"parameters without a default name the module captures whose drawn modules it receives, and "
                    f"{what} (its module captures: {captures}); rename the parameter after one of them or give "
                    f"it a default.")

    def tensor_domain(self, name: str) -> TensorDomain:
        """How tensor argument ``name`` is drawn: its own settings over the rule's."""
        own = self.inputs.get(name, {})
        return TensorDomain(
            dtypes=_dtypes(own["dtypes"], "dtypes", name) if "dtypes" in own else None,
            min_value=own.get("min_value", self.min_value),
            max_value=own.get("max_value", self.max_value),
            special_values=own.get("special_values", self.special_values),
            shape=tuple(own["shape"]) if "shape" in own else None,
        )

    def describe(self) -> str:
        """One line: what was declared, and what is drawn."""
        dtypes = ", ".join(str(d).replace("torch.", "") for d in self.dtypes)
        values = "any finite value" if self.min_value is None and self.max_value is None else (
            f"finite values in [{self.min_value}, {self.max_value}]")
        values += ", nan, ±inf" if self.special_values else " (no nan or inf)"
        drawn = (f"dtypes {dtypes}{' (mixable)' if self.mixed_dtypes else ''}; ranks {self.ranks[0]}..{self.ranks[1]}; "
                 f"sides {self.sides[0]}..{self.sides[1]}; shapes {self.shapes}; values {values}")
        declared = f"declared {_show_declaration(self.declared)}" if self.declared else "default"
        return f"{declared} -> {drawn}"


_KEY_OF_KIND = {"literal": "literals", "module": "modules", "tensor": "inputs"}


def _show_declaration(declared: Mapping[str, Any]) -> str:
    def show(v: Any) -> str:
        if isinstance(v, Mapping):
            return "{" + ", ".join(f"{k!r}: {show(x)}" for k, x in v.items()) + "}"
        if isinstance(v, (tuple, list)):
            inner = ", ".join(show(x) for x in v)
            if isinstance(v, list):
                return f"[{inner}]"
            return f"({inner},)" if len(v) == 1 else f"({inner})"
        if callable(v) and not isinstance(v, torch.dtype) and not _is_strategy(v):
            return getattr(v, "__qualname__", repr(v))
        return repr(v)
    return show(declared)


@attrs.frozen(eq=False)
class Tolerance(Mapping[str, float]):
    """A rule's ``tolerance`` declaration: ``rtol`` and ``atol``, each ``None`` when left to
    ``torch.testing.assert_close``'s default for the output's dtype. Read as a mapping it is
    what was declared.

    >>> t = Tolerance.parse({"atol": 1e-3}, where="rule 'r'")
    >>> t.rtol, t.atol, dict(t), t == {"atol": 1e-3}
    (None, 0.001, {'atol': 0.001}, True)
    """

    rtol: float | None = None
    atol: float | None = None
    #: The order the keys were declared in (what the mapping shows first).
    order: tuple[str, ...] = attrs.field(default=TOLERANCE_KEYS, repr=False)

    @classmethod
    def parse(cls, declared: Mapping[str, Any] | None, *, where: str) -> Tolerance:
        """Validate a ``tolerance`` declaration; errors name the rule (``where``) and the fix."""
        if isinstance(declared, Tolerance):
            return declared
        if declared is not None and not isinstance(declared, Mapping):
            raise RuleDefinitionError(f"{where}: tolerance= takes a dict such as {{'rtol': 1e-5, 'atol': 1e-6}}, "
                                      f"got {declared!r}.")
        declared = dict(declared or {})
        _check_keys(declared, TOLERANCE_KEYS, "tolerance", where,
                    fix="declare tolerance={'rtol': ..., 'atol': ...} (either may be left out)")
        for key, value in declared.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise RuleDefinitionError(f"{where}: tolerance['{key}'] must be a number >= 0, got {value!r}.")
        return cls(**{k: float(v) for k, v in declared.items()}, order=tuple(declared))

    def _declared(self) -> dict[str, float]:
        values = {"rtol": self.rtol, "atol": self.atol}
        return {k: v for k in (*self.order, *TOLERANCE_KEYS) if (v := values.get(k)) is not None}

    def __getitem__(self, key: str) -> float:
        return self._declared()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._declared())

    def __len__(self) -> int:
        return len(self._declared())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Tolerance):
            return (self.rtol, self.atol) == (other.rtol, other.atol)
        return isinstance(other, Mapping) and self._declared() == dict(other)

    __hash__ = None  # type: ignore[assignment]  # equal to the dict it stands for, which is unhashable

    @property
    def declared(self) -> bool:
        return self.rtol is not None or self.atol is not None

    def describe(self, dtype: torch.dtype | None = None) -> str:
        """One line for reports, with the values in effect for ``dtype`` (default float32).

        >>> Tolerance.parse({"atol": 1e-3}, where="rule 'r'").describe(torch.float32)
        "declared {'atol': 0.001} (for torch.float32: rtol=1.3e-06, atol=0.001)"
        """
        dtype = torch.float32 if dtype is None else dtype
        default_rtol, default_atol = default_tolerance(dtype)
        rtol = default_rtol if self.rtol is None else self.rtol
        atol = default_atol if self.atol is None else self.atol
        exact = not (dtype.is_floating_point or dtype.is_complex)
        effective = "exact" if exact else f"rtol={rtol:g}, atol={atol:g}"
        if not self.declared:
            return f"default (as torch.testing.assert_close; for {dtype}: {effective})"
        return f"declared {self._declared()} (for {dtype}: {effective})"
