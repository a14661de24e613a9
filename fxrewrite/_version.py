"""The package version, its one source (pyproject reads it; ``fxrewrite.__version__`` re-exports it)."""

__version__ = "0.1.0"
