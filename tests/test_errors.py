"""The documented exception tree: every error class is exported and named in the docstring."""

from __future__ import annotations

import inspect

import elastico_extender.errors as errors


def test_every_error_is_exported_and_documented():
    classes = {
        name
        for name, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, errors.ElasticoError) and obj.__module__ == errors.__name__
    }
    assert classes == set(errors.__all__)
    for name in classes:
        assert name in (errors.__doc__ or ""), f"{name} missing from the tree in the docstring"
