"""Fixtures for the store-API tests."""

import pytest


@pytest.fixture(autouse=True)
def on_every_store(store_backend):
    """Each test runs on the embedded store and on two remote shards (test/conftest.py)."""
    yield store_backend
