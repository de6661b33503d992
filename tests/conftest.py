"""The default suite (`make test`, in parallel over the cores with pytest-xdist) and `pytest --long`
(`make test-long`): release checks with many more generated examples (allocator state machines 5,000,
CLI fuzzing 1,000), live re-runs of vLLM's own code over the stored cases, whole-report regenerations,
every README command and the 100,000-request memory test.

The default suite is deterministic: hypothesis draws the same examples on every run (derandomized, no
example database), so a run on two workers and a run on one judge the same inputs; `--long` draws fresh
random examples every time.
"""

from hypothesis import settings

LONG_EXAMPLES = 5000


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", help="release checks: many more generated examples")


def pytest_configure(config):
    settings.register_profile("long", max_examples=LONG_EXAMPLES, deadline=None)
    settings.register_profile("default-suite", derandomize=True, database=None)
    settings.load_profile("long" if config.getoption("--long") else "default-suite")


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--long"):
        import pytest
        skip = pytest.mark.skip(reason="release check: run with --long (make test-long)")
        for item in items:
            if "long" in item.keywords:
                item.add_marker(skip)
