"""The view's colour pairs (``ui/static/app.css``), light and dark, each at least 4.5:1 (issue 58
item 7). A quick check of the stylesheet's variables without a browser; the system tier checks
every text as Chromium draws it (``tests/system/contrast.py``, which this reuses for the maths)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.system.contrast import MINIMUM, contrast

CSS = Path(__file__).resolve().parents[2] / "airflow_provider_liftbridge" / "ui" / "static" / "app.css"
#: (text, background) variables of app.css drawn together.
PAIRS = [
    ("fg", "bg"),
    ("muted", "bg"),
    ("muted", "head"),  # table headings
    ("muted", "row-hover"),
    ("fg", "head"),  # a button under the mouse
    ("link", "bg"),
    ("link", "row-hover"),
    ("accent-fg", "accent"),  # the active tab, Search, a pressed Pause
    ("bad", "bg"),
    ("bad", "row-hover"),
    ("badge-fg", "badge-bg"),
    ("paused-fg", "paused-bg"),
    ("paused-fg", "bg"),  # .warn
    ("ro-fg", "ro-bg"),
    ("ok-fg", "ok-bg"),
    ("warn-fg", "warn-bg"),
    ("stall-fg", "stall-bg"),
    ("stop-fg", "stop-bg"),
    ("err-fg", "err-bg"),
]


def variables(theme: str) -> dict[str, str]:
    """The colour variables of ``:root`` (light), and for dark those of ``:root[data-theme="dark"]`` over them."""
    css = CSS.read_text()
    found: dict[str, str] = {}
    for selector, body in re.findall(r"(:root(?:\[data-theme=\"dark\"\])?)\s*\{([^}]*)\}", css):
        if selector == ":root" or theme == "dark":
            found |= dict(re.findall(r"--([\w-]+):\s*(#[0-9a-fA-F]{6})", body))
    return found


def rgb(hex_colour: str) -> str:
    return "rgb({}, {}, {})".format(*(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)))


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_colour_pair_is_at_least_4_5_to_1(theme: str) -> None:
    colours = variables(theme)
    low = {}
    for fg, bg in PAIRS:
        ratio = contrast(rgb(colours[fg]), 1.0, [rgb(colours[bg])])
        if ratio < MINIMUM:
            low[f"{fg} {colours[fg]} on {bg} {colours[bg]}"] = round(ratio, 2)
    assert low == {}


def test_the_ratio_is_wcags() -> None:
    """Known values: black on white 21:1, #777 on white about 4.48:1; half-transparent black text
    (by its colour's alpha or by opacity) on white is the grey it makes."""
    assert round(contrast("rgb(0, 0, 0)", 1.0, ["rgb(255, 255, 255)"]), 1) == 21.0
    assert round(contrast("rgb(119, 119, 119)", 1.0, ["rgb(255, 255, 255)"]), 2) == 4.48
    half = contrast("rgb(127.5, 127.5, 127.5)", 1.0, [])
    assert abs(contrast("rgba(0, 0, 0, 0.5)", 1.0, []) - half) < 1e-9
    assert abs(contrast("rgb(0, 0, 0)", 0.5, ["rgba(255, 255, 255, 0.3)"]) - half) < 1e-9  # white under all
