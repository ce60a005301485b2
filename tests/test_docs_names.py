"""docs/architecture.md names only code that exists.

Every backticked name that looks like code is looked up in the product's Python: a class
(`SessionRunner`), a member of one (`SessionRunner.connection_for_turn`, `Session.objects.one_of`:
the class and the last name), or a constant or setting (`CRAFT_WARM_AGENTS`,
`ONE_STATEMENT_ROWS`). A rename that leaves the page behind fails here.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["docs/architecture.md"]
CLASS = re.compile(r"^[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*$|^[A-Z][a-z0-9]+$")
MEMBER = re.compile(r"^([A-Z][A-Za-z0-9]*)(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")
CONSTANT = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
# Words of other languages the page quotes (SQL, HTTP), not names of this code.
NOT_CODE = {"SELECT", "IMMEDIATE"}


@cache
def source() -> str:
    files = [*ROOT.glob("craft/**/*.py"), *ROOT.glob("sandboxes/**/*.py")]
    return "\n".join(p.read_text() for p in files if "migrations" not in p.parts)


def defines_class(name: str) -> bool:
    return re.search(rf"^\s*class {name}\b", source(), re.M) is not None


def defines_member(name: str) -> bool:
    pattern = rf"^\s*(?:async )?def {name}\b|^\s*(?:self\.)?{name}\s*(?::[^=\n]*)?=|^\s*{name}:"
    return re.search(pattern, source(), re.M) is not None


def defines_constant(name: str) -> bool:
    return re.search(rf"^\s*{name}\s*(?::[^=\n]*)?=|[\"']{name}[\"']", source(), re.M) is not None


def names(page: str) -> list[str]:
    found = []
    for quoted in re.findall(r"`([^`\n]+)`", (ROOT / page).read_text()):
        name = re.sub(r"\(.*\)$", "", quoted.strip())  # `Cache.get(adopt=...)`: the name
        if CLASS.match(name) or MEMBER.match(name) or CONSTANT.match(name):
            found.append(name)
    return sorted(set(found) - NOT_CODE)


@pytest.mark.parametrize("page", PAGES)
def test_every_name_of_code_on_the_page_exists(page):
    missing = []
    for name in names(page):
        if CONSTANT.match(name):
            ok = defines_constant(name)
        elif "." in name:
            owner, *_, member = name.split(".")
            ok = defines_class(owner) and defines_member(member)
        else:
            ok = defines_class(name)
        if not ok:
            missing.append(name)
    assert names(page), "no name found: the pattern is wrong"
    assert missing == [], f"{page} names what the code does not have: {missing}"
