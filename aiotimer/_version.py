"""The package's version (``pyproject.toml`` states the same; a test checks they agree)."""

__version__ = "0.1.0"
