"""What a wheel carries besides code: the licence the sources state, classifiers, py.typed.

(Checked by hand once with `pip wheel --no-deps .`: the wheel holds tracekit/py.typed and
dist-info/licenses/LICENSE, its METADATA the License-Expression and these classifiers.)
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_licence_file_is_the_one_the_sources_state() -> None:
    assert PROJECT["license"] == "GPL-2.0-only"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "GNU GENERAL PUBLIC LICENSE" in text and "Version 2, June 1991" in text
    stated = {
        m.group(1)
        for path in (ROOT / "reproducer").glob("*.[ch]")
        if (m := re.search(r"SPDX-License-Identifier: (\S+)", path.read_text()))
    }
    assert stated == {PROJECT["license"]}
    # An SPDX expression and a License :: classifier may not be given together (PEP 639).
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]


def test_classifiers_name_the_pythons_requires_python_allows() -> None:
    floor = tuple(int(p) for p in PROJECT["requires-python"].removeprefix(">=").split("."))
    versions = [
        tuple(int(p) for p in c.rsplit(" ", 1)[1].split("."))
        for c in PROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert versions and min(versions) == floor
    assert "Typing :: Typed" in PROJECT["classifiers"]


def test_the_package_says_it_is_typed() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert (ROOT / "tracekit" / "py.typed").is_file()
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["tracekit"]
    assert "urls" not in PROJECT  # none is known; none is invented
