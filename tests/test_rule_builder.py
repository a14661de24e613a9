"""RuleBuilder (what @fxrewrite.rule returns) explains a pattern left without its rule: the
line, and the real fix (give the replacement the pattern's name, or pass the name)."""

from __future__ import annotations

import textwrap

import torch

import fxrewrite


def _module(tmp_path, source: str) -> dict:
    path = tmp_path / "my_rules.py"
    path.write_text(textwrap.dedent(source))
    namespace: dict = {"__name__": "my_rules"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


def test_a_replacement_with_a_name_of_its_own_is_explained_with_both_lines_and_the_fix(tmp_path):
    namespace = _module(tmp_path, """\
        import torch
        from fxrewrite import rule

        @rule
        def neg_neg(x):
            return torch.neg(torch.neg(x))

        @neg_neg.replacement
        def neg_neg_repl(x):
            return x
        """)
    builder = namespace["neg_neg"]
    assert isinstance(namespace["neg_neg_repl"], fxrewrite.Rule) and builder.rule is namespace["neg_neg_repl"]
    message = builder.unfinished_message("neg_neg", str(tmp_path / "my_rules.py"))
    assert message.startswith(f"{tmp_path / 'my_rules.py'}:4: 'neg_neg' still holds the bare pattern")
    assert "its replacement 'neg_neg_repl' (line 8) was decorated with @neg_neg.replacement" in message
    assert "Give the replacement the pattern's name ('def neg_neg(...)' under '@neg_neg.replacement')" in message
    assert "'@fxrewrite.rule(name=\"neg_neg\")'" in message and "'del neg_neg'" in message
    assert "decorate the replacement with" not in message  # the old advice, already followed
    assert repr(builder) == "<pattern neg_neg (line 4) finished by @neg_neg.replacement>"


def test_a_pattern_never_given_a_replacement_is_explained_with_its_line():
    @fxrewrite.rule
    def lone(x):
        return torch.neg(x)

    line = lone.pattern.__code__.co_firstlineno
    message = lone.unfinished_message()
    assert message.startswith(f"{__file__}:{line}: 'lone' is a pattern awaiting its replacement")
    assert "@lone.replacement and give it the same name ('def lone(...)')" in message
    assert lone.rule is None and repr(lone) == f"<pattern lone (line {line}) awaiting @lone.replacement>"


def test_the_usual_idiom_leaves_no_builder_behind(tmp_path):
    namespace = _module(tmp_path, """\
        import torch
        from fxrewrite import rule

        @rule
        def neg_neg(x):
            return torch.neg(torch.neg(x))

        @neg_neg.replacement
        def neg_neg(x):
            return x
        """)
    assert isinstance(namespace["neg_neg"], fxrewrite.Rule)
