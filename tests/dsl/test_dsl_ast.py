"""dsl.ast.Node, the hand-written base of the AST classes (it replaced ``attrs.frozen``: no code
generated and compiled per class at import): construction, frozenness, equality, hash, repr,
pickling and copying behave as the attrs classes did, and every class of the module is a Node."""

from __future__ import annotations

import copy
import pickle

import attrs
import pytest

from fxrewrite.dsl import ast, parse

SPAN = ast.Span(1, 2, 1, 3)


def test_every_ast_class_is_a_node_with_its_annotated_fields_in_order():
    assert set(ast.CLASSES) == {name for name in ast.__all__ if isinstance(getattr(ast, name), type)
                                and issubclass(getattr(ast, name), ast.Node)}
    assert ast.fields(ast.BinOp) == ("op", "left", "right", "span")
    assert ast.fields(ast.RuleDef)[-1] == "declarations"
    assert "Node" not in ast.CLASSES


def test_construction_keywords_positional_defaults_and_errors():
    assert ast.Span(line=1, column=2, end_line=1, end_column=3) == SPAN
    assert ast.SourceText("f.fxr", "text").name == "f.fxr"
    name = ast.Name(id="x", span=SPAN)
    assert (name.id, name.span) == ("x", SPAN)
    with pytest.raises(TypeError, match="positional"):
        ast.Name("x", SPAN)  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing required argument: 'span'"):
        ast.Name(id="x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'ident'"):
        ast.Name(ident="x", span=SPAN)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="multiple values for argument 'line'"):
        ast.Span(1, 2, 1, 3, line=4)  # type: ignore[misc]
    rewrite = ast.Rewrite(pattern=name, replacement=name, span=SPAN)
    rule = ast.RuleDef(name="r", doc=None, priority=0, lets=(), rewrite=rewrite, captures=(), conditions=(), span=SPAN)
    assert rule.declarations == ()
    assert list(vars(rule)) == list(ast.fields(ast.RuleDef))


def test_frozen_equality_hash_and_repr_as_attrs_made_them():
    a, b = ast.Name(id="x", span=SPAN), ast.Name(id="x", span=ast.Span(1, 2, 1, 3))
    assert a == b and hash(a) == hash(b)
    assert not a.__ne__(b)
    assert a != ast.Name(id="y", span=SPAN)
    assert ast.Wildcard(span=SPAN) != ast.Literal(value=None, span=SPAN)  # other class: never equal
    assert a != ("x", SPAN)
    assert len({a, b, ast.Name(id="y", span=SPAN)}) == 2
    for assign in (lambda: setattr(a, "id", "z"), lambda: delattr(a, "id"), lambda: setattr(a, "other", 1)):
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            assign()
    assert repr(a) == "Name(id='x', span=Span(line=1, column=2, end_line=1, end_column=3))"
    assert repr(ast.Wildcard(span=SPAN)) == "Wildcard(span=Span(line=1, column=2, end_line=1, end_column=3))"


def test_pickle_copy_and_replace_keep_the_value():
    text = "rule r \"doc\" priority 2:\n    let t = torch.neg(x)\n    t * 2.5 => x[1:, ...]\n    where x.dim() > 1\n"
    tree = parse(text, source="r.fxr")
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        again = pickle.loads(pickle.dumps(tree, protocol=protocol))
        assert again == tree and repr(again) == repr(tree)
    assert copy.deepcopy(tree) == tree and copy.copy(tree) == tree
    renamed = tree.replace(source=ast.SourceText("s.fxr", text))
    assert renamed.source.name == "s.fxr" and renamed.rules == tree.rules and tree.source.name == "r.fxr"
    with pytest.raises(TypeError, match="unexpected keyword"):
        tree.replace(nope=1)
