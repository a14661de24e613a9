"""torch.fx-compatible ``replace_pattern`` (placeholder, replaced below)."""
def replace_pattern(*a, **k):
    raise NotImplementedError
def replace_pattern_with_filters(*a, **k):
    raise NotImplementedError
