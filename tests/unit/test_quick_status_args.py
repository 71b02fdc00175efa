"""When `cdc status`'s fast path declines (returns None) before asking any daemon: anything but
the plain form, and any problem in what it reads that the slow path would report."""

from cdc.runtime.quick_status import _arguments, _read_config

FILE = """
sources:
  - {name: a, type: generator}
sinks:
  - {name: b, type: sql, url: '${NEVER_SET_FOR_THIS_TEST}', topics: [x]}
http: "${QUICK_HTTP:-127.0.0.1:9999}"
"""


def test_only_the_plain_form_is_taken():
    assert _arguments(["f.yaml"]) == ("f.yaml", [], False)
    assert _arguments(["f.yaml", "a", "--json"]) == ("f.yaml", ["a"], True)
    for argv in ([], ["--help"], ["f.yaml", "-h"], ["f.yaml", "--js"], ["--", "f.yaml"]):
        assert _arguments(argv) is None, argv


def test_the_address_is_interpolated_and_problems_matter_only_for_connectors_shown(monkeypatch):
    monkeypatch.delenv("NEVER_SET_FOR_THIS_TEST", raising=False)
    monkeypatch.delenv("QUICK_HTTP", raising=False)
    assert _read_config(FILE, "f.yaml", ["a"]) == (("127.0.0.1", 9999), ["a"])
    monkeypatch.setenv("QUICK_HTTP", "[::1]:8100")
    assert _read_config(FILE, "f.yaml", ["a"]) == (("::1", 8100), ["a"])
    assert _read_config(FILE, "f.yaml", []) is None          # b is shown: its unset variable matters
    assert _read_config(FILE, "f.yaml", ["b"]) is None
    assert _read_config(FILE, "f.yaml", ["nope"]) is None    # the slow path names what is wrong


def test_no_daemon_address_or_an_unreadable_file_goes_the_slow_way():
    assert _read_config("sources: []\nhttp: null\n", "f.yaml", []) is None
    assert _read_config("sources: []\nhttp: nonsense\n", "f.yaml", []) is None
    assert _read_config("sources: [\n", "f.yaml", []) is None
    assert _read_config("sources: []\n", "f.yaml", []) is None
    assert _read_config("sources: [{name: a}]\n", "f.yaml", []) == (("127.0.0.1", 8083), ["a"])
