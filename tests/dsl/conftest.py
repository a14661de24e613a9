import pytest

collect_ignore = ["data"]  # deliberately unsound rule fixtures, not rules to property-test


@pytest.fixture(scope="session", autouse=True)
def _rule_parser_built() -> None:
    """lark is imported and the rule parser built on the first parse of a process (not at
    ``import fxrewrite``): pay that once here, in set-up, not in the call of whichever test
    happens to parse first (the one-second rule counts calls only)."""
    from fxrewrite.dsl.parse import parse

    parse("rule warm_up:\n    torch.neg(x) => x\n")
