"""fxrewrite._cache: parsed rule files cached by content, never trusted blindly."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fxrewrite._version
from fxrewrite import RuleSyntaxError, _cache
from fxrewrite.dsl.ast import RuleFile
from fxrewrite.dsl.parse import MAX_DEPTH, parse
from fxrewrite.loader import load_rules

ROOT = Path(__file__).resolve().parent.parent
TEXT = "rule double_neg \"Replaces -(-x) by x.\":\n    torch.neg(torch.neg(x)) => x\n"


@pytest.fixture
def cache_home(monkeypatch, tmp_path):
    """A cache of its own, on."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(_cache.ENABLE_VARIABLE, raising=False)
    return tmp_path / "xdg" / "fxrewrite"


def fresh_parse(text: str, source: str):
    from fxrewrite.dsl._syntax import rule_file
    from fxrewrite.dsl.ast import SourceText

    return rule_file(SourceText(source, text), max_depth=MAX_DEPTH)


def assert_same_parse(cached, fresh) -> None:
    assert cached == fresh
    assert repr(cached) == repr(fresh)  # 1, 1.0 and True are equal; their reprs are not


def trusted_entries():
    """The entries the cache would hand out now (stored under the key of their own text)."""
    for path in _cache.entries():
        try:
            key, value = _cache.read_entry(path)
        except Exception:  # pruned meanwhile by another process, or damaged: never handed out
            continue
        if isinstance(value, RuleFile) and key == _cache.rule_file_key(value.source.text) and path.stem == key:
            yield value


# ---- where the cache is --------------------------------------------------------------------------


def test_the_cache_lives_in_the_user_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(_cache.ENABLE_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _cache.directory() == tmp_path / "fxrewrite"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for unusable in ("", "relative/cache"):  # the XDG default then
        monkeypatch.setenv("XDG_CACHE_HOME", unusable)
        assert _cache.directory() == tmp_path / "home" / ".cache" / "fxrewrite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert _cache.directory() == tmp_path / "home" / ".cache" / "fxrewrite"
    package = Path(fxrewrite.__file__).resolve().parent
    assert package not in _cache.directory().resolve().parents


@pytest.mark.parametrize("value", ["0", "false", "off", "no"])
def test_fxrewrite_cache_0_turns_it_off(monkeypatch, tmp_path, value):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(_cache.ENABLE_VARIABLE, value)
    assert _cache.directory() is None
    (tmp_path / "r.fxr").write_text(TEXT)
    assert load_rules(tmp_path / "r.fxr").names == ("double_neg",)
    assert not (tmp_path / "fxrewrite").exists() and _cache.load_rule_file(TEXT, "r.fxr") is None


# ---- what is cached, and that it equals a fresh parse --------------------------------------------


def test_loading_a_rule_file_caches_its_parse_and_the_next_load_parses_nothing(cache_home, tmp_path, monkeypatch):
    path = tmp_path / "r.fxr"
    path.write_text(TEXT)
    first = load_rules(path)
    assert len(_cache.entries()) == 1 and _cache.entries()[0].parent == cache_home

    def no_parsing(src, **options):
        raise AssertionError(f"{src.name} was parsed although its parse is cached")

    monkeypatch.setattr("fxrewrite.dsl._syntax.rule_file", no_parsing)
    second = load_rules(path)
    assert [(r.name, r.origin, r.doc) for r in second] == [(r.name, r.origin, r.doc) for r in first]
    assert str(second["double_neg"].compiled.graph) == str(first["double_neg"].compiled.graph)


def test_a_cached_parse_is_keyed_by_text_and_named_by_the_caller(cache_home):
    _cache.store_rule_file(parse(TEXT, source="a.fxr"))
    hit = _cache.load_rule_file(TEXT, "elsewhere/b.fxr")
    assert hit is not None and hit.source.name == "elsewhere/b.fxr"
    assert_same_parse(hit, fresh_parse(TEXT, "elsewhere/b.fxr"))
    assert _cache.load_rule_file(TEXT + "\n", "a.fxr") is None


@pytest.mark.slow  # parses the library and the examples twice: 2 s
def test_every_cached_parse_equals_a_fresh_parse(cache_home):
    """The library's and the examples' rule files go through the cache; then every entry the cache
    would hand out (of this directory, and of the user's own cache if it has any) is compared with
    a fresh parse of its text."""
    load_rules()
    for folder in sorted((ROOT / "examples").glob("*_rules")):
        load_rules(folder)
    entries = list(trusted_entries())
    assert len(entries) >= len(list(ROOT.glob("rules/*.fxr")))
    for entry in entries:
        assert_same_parse(entry, fresh_parse(entry.source.text, entry.source.name))


def test_the_user_cache_holds_no_entry_that_differs_from_a_fresh_parse():
    for entry in trusted_entries():  # the real cache directory of whoever runs the tests
        assert_same_parse(entry, fresh_parse(entry.source.text, entry.source.name))


def test_a_text_that_does_not_parse_is_never_cached_and_fails_on_every_load(cache_home, tmp_path):
    path = tmp_path / "bad.fxr"
    path.write_text("rule r:\n    torch.neg(x) x\n")
    for _ in range(2):
        with pytest.raises(RuleSyntaxError, match=r"bad.fxr:2:18: expected '=>'"):
            load_rules(path)
    assert _cache.entries() == []


def test_rules_built_from_a_cached_parse_are_checked_as_from_a_fresh_one(cache_home, tmp_path):
    path = tmp_path / "unused.fxr"
    path.write_text("rule r:\n    torch.neg(torch.relu(x)) => torch.relu(y)\n")
    for _ in range(2):  # the second load takes the parse from the cache; the rule is refused again
        with pytest.raises(fxrewrite.RuleDefinitionError, match=r"unused.fxr:2"):
            load_rules(path)
    assert len(_cache.entries()) == 1


# ---- never trusted blindly -------------------------------------------------------------------------


def _entry_path() -> Path:
    return _cache.directory() / f"{_cache.rule_file_key(TEXT)}.ast"


@pytest.mark.parametrize("damage, reason", [
    (lambda data: b"", "not an fxrewrite cache entry"),
    (lambda data: data[: len(data) // 2], "Error"),
    (lambda data: data.replace(b"fxrewrite-ast-2", b"fxrewrite-ast-0"), "not an fxrewrite cache entry"),
    (lambda data: b"fxrewrite-ast-2\n" + pickle.dumps(("k", print)), "AST nodes only, not builtins.print"),
    (lambda data: b"fxrewrite-ast-2\n" + pickle.dumps([1, 2]), "not a (key, value) pair"),
], ids=["empty", "truncated", "other format", "code", "not an entry"])
def test_a_damaged_entry_is_ignored_with_a_debug_message_and_rewritten(cache_home, caplog, damage, reason):
    _cache.store_rule_file(parse(TEXT, source="a.fxr"))
    path = _entry_path()
    path.write_bytes(damage(path.read_bytes()))
    with caplog.at_level(logging.DEBUG, logger="fxrewrite._cache"):
        assert _cache.load_rule_file(TEXT, "a.fxr") is None
        rules = fxrewrite.parse_rules(TEXT, source="a.fxr", cached=True)
    assert rules.names == ("double_neg",)
    assert reason in caplog.text and "parsing a.fxr" in caplog.text
    assert_same_parse(_cache.load_rule_file(TEXT, "a.fxr"), fresh_parse(TEXT, "a.fxr"))


@pytest.mark.parametrize("entry, reason", [
    (lambda key, value: ("0" * 64, value), "stored under another key"),
    (lambda key, value: (key, value.rules[0]), "holds a RuleDef, not a RuleFile"),
    (lambda key, value: (key, fresh_parse(TEXT.replace("neg", "abs"), "a.fxr")), "the parse of another text"),
], ids=["stale key", "wrong type", "other text"])
def test_an_entry_that_is_not_the_parse_of_this_text_is_ignored(cache_home, caplog, entry, reason):
    _cache.store_rule_file(parse(TEXT, source="a.fxr"))
    path = _entry_path()
    key, value = _cache.read_entry(path)
    path.write_bytes(b"fxrewrite-ast-2\n" + pickle.dumps(entry(key, value)))
    with caplog.at_level(logging.DEBUG, logger="fxrewrite._cache"):
        assert _cache.load_rule_file(TEXT, "a.fxr") is None
    assert reason in caplog.text


def test_the_key_changes_with_the_versions_and_the_parser(monkeypatch):
    before = _cache.rule_file_key(TEXT)
    monkeypatch.setattr(fxrewrite._version, "__version__", "999.0")
    _cache._environment_fingerprint.cache_clear()
    try:
        assert _cache.rule_file_key(TEXT) != before
    finally:
        monkeypatch.undo()
        _cache._environment_fingerprint.cache_clear()
    assert _cache.rule_file_key(TEXT) == before
    assert "grammar.lark" in " ".join(_cache._PARSER_SOURCES) and "_to_ast.py" in " ".join(_cache._PARSER_SOURCES)


def test_a_cache_that_cannot_be_written_is_read_only_and_silent(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file where the directory should be
    monkeypatch.delenv(_cache.ENABLE_VARIABLE, raising=False)
    _cache.store_rule_file(parse(TEXT, source="a.fxr"))
    assert _cache.load_rule_file(TEXT, "a.fxr") is None and _cache.entries() == []


def test_old_entries_beyond_the_limit_are_removed(cache_home, monkeypatch):
    monkeypatch.setattr(_cache, "MAX_ENTRIES", 3)
    for i in range(5):
        _cache.store_rule_file(parse(TEXT.replace("double_neg", f"r{i}"), source="a.fxr"))
    assert len(_cache.entries()) == 3


@pytest.mark.slow  # two fresh processes
def test_a_cold_process_loads_the_cached_library_without_lark(cache_home):
    script = textwrap.dedent("""
        import sys, fxrewrite
        rules = fxrewrite.load_rules()
        print(len(rules), 'lark' in sys.modules)
    """)
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
            for _ in range(2)]
    count = len(load_rules())
    assert [r.stdout.split() for r in runs] == [[str(count), "True"], [str(count), "False"]], runs[1].stderr


# ---- traces of the patterns -------------------------------------------------------------------------


def _graph_facts(graph) -> list:
    """Everything a traced graph says (as tests/test_pattern.py compares the quick tracer's)."""
    def plain(value):
        return torch.fx.node.map_arg(value, lambda n: ("node", n.name))

    nodes = [(n.op, n.name, n.target, plain(n.args), plain(n.kwargs), n.type, dict(n.meta)) for n in graph.nodes]
    return [nodes, graph._co_fields, graph.python_code("self").src]


def _counting_traces(monkeypatch) -> list:
    from fxrewrite import pattern

    traced = []
    real = pattern._traced
    monkeypatch.setattr(pattern, "_traced", lambda fn, *args: traced.append(fn.__name__) or real(fn, *args))
    return traced


def test_every_replayed_pattern_of_the_library_equals_a_fresh_trace(cache_home, monkeypatch):
    """The trace cache against its slow twin (CACHED_TRACES = False: every pattern traced), on
    every rule file of the library: the second load replays every pattern from the cache, and
    each replayed graph equals a fresh trace, node by node, code fields and generated code."""
    import fxrewrite.dsl

    files = sorted(ROOT.glob("rules/*.fxr"))
    assert files
    traced = _counting_traces(monkeypatch)
    for path in files:
        cold = fxrewrite.parse_rules(path.read_text(), source=str(path), cached=True)
        assert len(traced) == len(cold)
        traced.clear()
        warm = fxrewrite.parse_rules(path.read_text(), source=str(path), cached=True)
        assert traced == [], f"{path.name}: {traced} traced although the cache holds their traces"
        monkeypatch.setattr(fxrewrite.dsl, "CACHED_TRACES", False)
        fresh = fxrewrite.parse_rules(path.read_text(), source=str(path), cached=True)
        monkeypatch.setattr(fxrewrite.dsl, "CACHED_TRACES", True)
        assert len(traced) == len(fresh) == len(warm)
        traced.clear()
        for replayed, traced_rule in zip(warm, fresh):
            assert replayed.name == traced_rule.name
            assert _graph_facts(replayed.compiled.graph) == _graph_facts(traced_rule.compiled.graph), replayed.name
            assert replayed.compiled.anchor_key == traced_rule.compiled.anchor_key


def test_a_trace_naming_a_function_replaced_since_is_traced_again(cache_home, monkeypatch):
    text = "rule relu_relu:\n    torch.relu(torch.relu(x)) => torch.relu(x)\n"
    fxrewrite.parse_rules(text, source="a.fxr", cached=True)
    traced = _counting_traces(monkeypatch)
    monkeypatch.setattr(torch, "relu", torch.sigmoid)  # torch.relu no longer names what the record names
    rules = fxrewrite.parse_rules(text, source="a.fxr", cached=True)
    assert traced == ["relu_relu_pattern"]
    targets = [n.target for n in rules["relu_relu"].compiled.graph.nodes if n.op == "call_function"]
    assert targets == [torch.sigmoid, torch.sigmoid]  # what a fresh trace records


def test_with_names_or_under_a_function_mode_patterns_are_traced(cache_home, monkeypatch):
    text = "rule neg_neg:\n    torch.neg(torch.neg(x)) => x\n"
    fxrewrite.parse_rules(text, source="a.fxr", cached=True)
    traced = _counting_traces(monkeypatch)
    fxrewrite.parse_rules(text, source="a.fxr", cached=True, names={"unused": 1})
    with torch.device("meta"):
        fxrewrite.parse_rules(text, source="a.fxr", cached=True)
    assert traced == ["neg_neg_pattern", "neg_neg_pattern"]


def _trace_entry() -> Path:
    return _cache.directory() / f"{_cache.trace_key(TEXT)}.traces"


@pytest.mark.parametrize("damage, reason", [
    (lambda data: data[: len(data) // 2], "Error"),
    (lambda data: b"fxrewrite-traces-2\n" + pickle.dumps(("k", print)), "plain data only, not builtins.print"),
    (lambda data: b"fxrewrite-traces-2\n" + pickle.dumps(("0" * 64, TEXT, {})), "another key"),
    (lambda data: data.replace(b"fxrewrite-traces-2", b"fxrewrite-traces-1"), "not an fxrewrite trace entry"),
], ids=["truncated", "code", "stale key", "other format"])
def test_a_damaged_trace_entry_is_ignored_and_the_patterns_traced(cache_home, caplog, monkeypatch, damage, reason):
    fxrewrite.parse_rules(TEXT, source="a.fxr", cached=True)
    path = _trace_entry()
    path.write_bytes(damage(path.read_bytes()))
    traced = _counting_traces(monkeypatch)
    with caplog.at_level(logging.DEBUG, logger="fxrewrite._cache"):
        rules = fxrewrite.parse_rules(TEXT, source="a.fxr", cached=True)
    assert traced == ["double_neg_pattern"] and rules.names == ("double_neg",)
    assert reason in caplog.text and "tracing a.fxr" in caplog.text
    assert _cache.load_traces(TEXT, "a.fxr") is not None  # rewritten


def test_the_trace_key_covers_the_tracer_sources_and_the_fx_wrapped_functions(monkeypatch):
    from torch.fx import _symbolic_trace

    before = _cache.trace_key(TEXT)
    assert before != _cache.rule_file_key(TEXT)
    assert {"pattern.py", "_torch.py", "dsl/compile.py", "dsl/scope.py"} <= set(_cache._TRACER_SOURCES)
    monkeypatch.setitem(_symbolic_trace._wrapped_fns_to_patch, (0, "helper"), {"__name__": "mine"})
    assert _cache.trace_key(TEXT) != before


def test_a_graph_is_recorded_as_plain_data_and_rebuilt_equal():
    from fxrewrite.pattern import graph_from_record, graph_record

    def pattern(x, y, n: int):
        return torch.cat([x[..., 1:n:2], y.to(torch.float16)], dim=-1).sum((0, 1), keepdim=True) * 0.5

    graph = torch.fx.symbolic_trace(pattern).graph
    record = graph_record(graph)
    assert record is not None and pickle.loads(pickle.dumps(record)) == record
    import io

    assert _cache._PlainUnpickler(io.BytesIO(pickle.dumps(record))).load() == record  # builds no class
    assert _graph_facts(graph_from_record(record, pattern))[0] == _graph_facts(graph)[0]


def _graph_calling(target) -> torch.fx.Graph:
    graph = torch.fx.Graph()
    graph.output(graph.call_function(target, (graph.placeholder("x"),)))
    return graph


@pytest.mark.parametrize("graph", [
    torch.fx.symbolic_trace(lambda x: x + torch.ones(2)).graph,  # a tensor constant (get_attr)
    _graph_calling(lambda x: x),  # a function not found again by its module and name
    _graph_calling(torch.Tensor.relu),  # a method
], ids=["tensor", "lambda", "method"])
def test_a_graph_holding_what_plain_data_cannot_name_is_not_recorded(graph):
    from fxrewrite.pattern import graph_record

    assert graph_record(graph) is None
    assert graph_record(_graph_calling(torch.relu)) is not None


@pytest.mark.slow  # loads the library three times: 1.5 s
def test_every_replayed_pattern_of_the_library_python_files_equals_a_fresh_trace(cache_home, monkeypatch):
    """The library's trace cache (Python rule files and .fxr files) against its slow twins
    (CACHED_LIBRARY_TRACES, CACHED_TRACES = False): the second load traces nothing, and every
    replayed graph equals a fresh trace."""
    import fxrewrite.dsl
    import fxrewrite.loader

    traced = _counting_traces(monkeypatch)
    cold = load_rules()
    assert len(traced) == len(cold)
    traced.clear()
    warm = load_rules()
    assert traced == []
    monkeypatch.setattr(fxrewrite.loader, "CACHED_LIBRARY_TRACES", False)
    monkeypatch.setattr(fxrewrite.dsl, "CACHED_TRACES", False)
    fresh = load_rules()
    assert len(traced) == len(fresh) == len(warm)
    for replayed, traced_rule in zip(warm, fresh):
        assert (replayed.name, replayed.origin) == (traced_rule.name, traced_rule.origin)
        assert _graph_facts(replayed.compiled.graph) == _graph_facts(traced_rule.compiled.graph), replayed.name
        assert replayed.compiled.anchor_key == traced_rule.compiled.anchor_key


_LIBRARY_FILE = '''
import torch
import fxrewrite
from _helpers_of_a_test import double

neg_twice = fxrewrite.Rule.from_functions(lambda x: double(x), lambda x: x, name="neg_twice")
'''


def test_a_library_python_file_is_replayed_until_it_or_a_helper_beside_it_changes(cache_home, monkeypatch, tmp_path):
    import fxrewrite.loader

    library = tmp_path / "library"
    library.mkdir()
    (library / "pairs.py").write_text(_LIBRARY_FILE)
    helper = library / "_helpers_of_a_test.py"
    helper.write_text("import torch\ndef double(x):\n    return torch.neg(torch.neg(x))\n")
    monkeypatch.setattr(fxrewrite.loader, "standard_rules_dir", lambda package=None: library)
    traced = _counting_traces(monkeypatch)
    load_rules(library)
    load_rules(library)
    assert len(traced) == 1  # the second load replayed the pattern
    helper.write_text("import torch\ndef double(x):\n    return torch.abs(torch.neg(x))\n")
    sys.modules.pop("_helpers_of_a_test", None)
    rules = load_rules(library)
    assert len(traced) == 2  # the helper changed: the key changed, the pattern was traced
    assert [n.target for n in rules["neg_twice"].compiled.graph.nodes if n.op == "call_function"] == [
        torch.neg, torch.abs]
    sys.modules.pop("_helpers_of_a_test", None)


def test_a_python_rule_file_outside_the_library_is_always_traced(cache_home, monkeypatch, tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("import torch\nimport fxrewrite\n"
                    "r = fxrewrite.Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name='r')\n")
    traced = _counting_traces(monkeypatch)
    load_rules(path)
    load_rules(path)
    assert len(traced) == 2


def test_a_replayed_pattern_is_checked_as_a_traced_one(cache_home, monkeypatch):
    """Only the trace is replayed: the checks of the graph (pattern_from_graph's) and of the
    rule run on a replayed graph, and what they refuse is refused with the same error."""
    import fxrewrite.dsl
    from fxrewrite import pattern

    fxrewrite.parse_rules(TEXT, source="a.fxr", cached=True)  # traces cached
    traced = _counting_traces(monkeypatch)

    def refuse(graph, param_of, outputs, where, fx_style):
        raise fxrewrite.RuleDefinitionError(f"{where}: refused by the test")

    monkeypatch.setattr(pattern, "_check_nodes", refuse)
    errors = []
    for cached_traces in (True, False):
        monkeypatch.setattr(fxrewrite.dsl, "CACHED_TRACES", cached_traces)
        with pytest.raises(fxrewrite.RuleDefinitionError, match="refused by the test") as info:
            fxrewrite.parse_rules(TEXT, source="a.fxr", cached=True)
        errors.append(str(info.value))
    assert traced == ["double_neg_pattern"]  # replayed first, traced second
    assert errors[0] == errors[1]
