"""Load a page in a real headless Chromium (Debian's ``chromium`` package) after its scripts ran,
and read what it shows.

``--virtual-time-budget`` lets the page's timers and fetches run for that much virtual time
before ``--dump-dom`` prints the document as the scripts left it: no DevTools client needed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str:
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    # Not a skip: the console test must run everywhere the suite runs (scripts/setup installs it).
    pytest.fail("no headless Chromium found (chromium); scripts/setup installs it with apt", pytrace=False)


def dump_dom(url: str, budget_ms: int = 8000) -> str:
    """The page's DOM after ``budget_ms`` of virtual time."""
    with tempfile.TemporaryDirectory(prefix="cdc-chromium-") as profile:
        out = subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
             f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
            capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": profile})
    assert out.returncode == 0, f"chromium failed ({out.returncode}): {out.stderr[-2000:]}"
    return out.stdout


class Element:
    def __init__(self, tag: str, attrs: dict[str, str]) -> None:
        self.tag, self.attrs, self.text, self.children = tag, attrs, "", []

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def find_all(self, cls: str | None = None, tag: str | None = None) -> list[Element]:
        found = []
        for child in self.children:
            if (cls is None or cls in child.classes) and (tag is None or child.tag == tag):
                found.append(child)
            found.extend(child.find_all(cls, tag))
        return found

    def find(self, cls: str) -> Element:
        [one] = self.find_all(cls)
        return one


VOID = {"br", "meta", "link", "img", "input", "hr", "col", "source"}


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.root = Element("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag):
        for index in range(len(self.stack) - 1, 0, -1):
            if self.stack[index].tag == tag:
                del self.stack[index:]
                return

    def handle_data(self, data):
        for element in self.stack[1:]:  # text belongs to every open element
            element.text += data


def parse(html: str) -> Element:
    tree = _Tree()
    tree.feed(html)
    return tree.root
