"""`pytest --long` (make test-long): release checks with many more generated examples (allocator state
machines 5,000, CLI fuzzing 1,000) and the 100,000-request memory test."""

from hypothesis import settings

LONG_EXAMPLES = 5000


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", help="release checks: many more generated examples")


def pytest_configure(config):
    settings.register_profile("long", max_examples=LONG_EXAMPLES, deadline=None)
    if config.getoption("--long"):
        settings.load_profile("long")


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--long"):
        import pytest
        skip = pytest.mark.skip(reason="release check: run with --long (make test-long)")
        for item in items:
            if "long" in item.keywords:
                item.add_marker(skip)
