"""The package's version: its one source (pyproject.toml reads it as the
distribution's version, attnaudit.__version__ re-exports it)."""

__version__ = "0.1.0"
