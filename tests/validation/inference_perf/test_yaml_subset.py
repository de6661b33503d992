"""The block-style YAML reader for inference-perf's config.yaml: values resolved as PyYAML's safe loader
resolves them (checked against PyYAML where it is installed, and against the expected values written out
by hand), and what it does not read named with its line."""

import pytest

from kvsim.validation.inference_perf.yaml_subset import loads

DOC = """\
# inference-perf, resolved
api:
  type: completion
  streaming: true
  headers: {}
data:
  type: shared_prefix   # a comment
  path: null
  shared_prefix:
    num_groups: 10
    ratio: 0.5
    small: 1.0e-05
    not_a_float: 1e3
    name: 'it''s'
    quoted: "a # b"
    url: http://0.0.0.0:8000
load:
  stages:
  - rate: 8
    duration: 600
  - rate: 20.0
    duration: 600
  sweep:
  flags: [1, 2.5, x]
  empty: []
  switches: [yes, No, OFF, ~]
nested:
    - a
    -
      - inner
    - k: v
      j:
        deep: -3
"""
EXPECTED = {
    "api": {"type": "completion", "streaming": True, "headers": {}},
    "data": {"type": "shared_prefix", "path": None,
             "shared_prefix": {"num_groups": 10, "ratio": 0.5, "small": 1e-05, "not_a_float": "1e3",
                               "name": "it's", "quoted": "a # b", "url": "http://0.0.0.0:8000"}},
    "load": {"stages": [{"rate": 8, "duration": 600}, {"rate": 20.0, "duration": 600}], "sweep": None,
             "flags": [1, 2.5, "x"], "empty": [], "switches": [True, False, False, None]},
    "nested": ["a", ["inner"], {"k": "v", "j": {"deep": -3}}],
}


def test_reads_a_config_dump_as_written_out_by_hand():
    got = loads(DOC, "config.yaml")
    assert got == EXPECTED
    assert type(got["load"]["stages"][0]["rate"]) is int and type(got["load"]["stages"][1]["rate"]) is float


def test_agrees_with_pyyaml():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (kvsim does not need it)")
    assert loads(DOC, "config.yaml") == yaml.safe_load(DOC)


@pytest.mark.parametrize("text, named", [
    ("a: &x 1\n", "config.yaml:1: '&x 1': anchors"),
    ("a:\n\tb: 1\n", "config.yaml:2: a tab in the indentation"),
    ("a: 1\na: 2\n", "config.yaml:2: duplicate key 'a'"),
    ("a: one\n  two\n", "config.yaml:2: unexpected indentation"),
    ("a:\n  b: 1\n  continued text\n", "config.yaml:3: expected 'key: value'"),
    ("a: |\n  text\n", "block scalars"),
    ("a: {b: 1}\n", "flow mappings"),
])
def test_what_it_does_not_read_is_named_with_its_line(text, named):
    with pytest.raises(ValueError) as err:
        loads(text, "config.yaml")
    assert named in str(err.value)
