"""The package version (one place; ``paraplan.__version__`` and every file paraplan writes
read it from here)."""

__version__ = "0.1.0"
