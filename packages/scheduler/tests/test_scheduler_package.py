"""The package installs and imports on its own."""

import importlib


def test_imports() -> None:
    module = importlib.import_module("lazygrad_scheduler")
    assert module.__doc__
