"""The contrast check of the Liftbridge view's browser tests (issue 58 item 7: every text at least
4.5:1, WCAG AA for text under 18.66 px bold / 24 px): one helper for every test and tab.

In the page, for every visible element with text of its own (a text node child), and every input
or select showing a value or a placeholder, the browser gives the text's colour, the element's
opacity with its ancestors', and the backgrounds from it up to the first opaque one. Here they are
composited (alpha over the one behind, white under all) and the WCAG contrast ratio computed.
Disabled controls are left out: WCAG exempts "inactive user interface components".
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MINIMUM", "contrast", "low_contrast", "luminance", "parse_colour"]

#: WCAG 2.x AA, normal text.
MINIMUM = 4.5

_TEXTS = """(root) => {
  const out = [];
  const opaque = (c) => !/^rgba\\(.*,\\s*0\\)$/.test(c) && c !== "transparent";
  for (const e of [root, ...root.querySelectorAll("*")]) {
    if (["SCRIPT", "STYLE", "OPTION", "TITLE", "CANVAS"].includes(e.tagName)) continue;
    if (e.closest(":disabled")) continue;
    if (!e.checkVisibility({checkOpacity: true, checkVisibilityCSS: true})) continue;
    const style = getComputedStyle(e);
    let text = [...e.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join("").trim();
    let colour = style.color;
    if (e.tagName === "INPUT" && ["text", "search", "", "datetime-local"].includes(e.getAttribute("type") || "")) {
      text = e.value || e.placeholder || "";
      if (!e.value && e.placeholder) colour = getComputedStyle(e, "::placeholder").color;
    } else if (e.tagName === "SELECT") {
      text = e.selectedOptions.length ? e.selectedOptions[0].textContent.trim() : "";
    }
    if (!text) continue;
    const layers = [];
    let opacity = 1;
    for (let n = e; n; n = n.parentElement) opacity *= Number(getComputedStyle(n).opacity);
    for (let n = e; n; n = n.parentElement) {
      const bg = getComputedStyle(n).backgroundColor;
      if (opaque(bg)) { layers.push(bg); if (!/^rgba/.test(bg)) break; }
    }
    const cls = typeof e.className === "string" && e.className ? `.${e.className.split(" ")[0]}` : "";
    const where = e.id ? `#${e.id}` : e.tagName.toLowerCase() + cls;
    out.push([where, text.slice(0, 40), colour, opacity, layers]);
  }
  return out;
}"""


def parse_colour(css: str) -> tuple[float, float, float, float]:
    """A computed CSS colour, ``rgb(r, g, b)`` or ``rgba(r, g, b, a)``, as (r, g, b, a), 0-255 and 0-1.

    :raises ValueError: another form (e.g. ``color(...)``), which this check cannot judge.
    """
    found = re.fullmatch(r"rgba?\(([\d.]+),\s*([\d.]+),\s*([\d.]+)(?:,\s*([\d.]+))?\)", css.strip())
    if not found:
        raise ValueError(f"cannot read the colour {css!r}")
    r, g, b, a = found.groups()
    return float(r), float(g), float(b), 1.0 if a is None else float(a)


def _over(top: tuple[float, float, float, float], below: tuple[float, float, float]) -> tuple[float, float, float]:
    alpha = top[3]
    return tuple(t * alpha + b * (1 - alpha) for t, b in zip(top[:3], below, strict=True))  # type: ignore[return-value]


def luminance(css: str) -> float:
    """Relative luminance (0 black .. 1 white) of a CSS colour (its alpha ignored)."""

    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b, _ = parse_colour(css)
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(colour: str, opacity: float, layers: list[str]) -> float:
    """The WCAG ratio of text in ``colour`` (times ``opacity``) over ``layers`` (the element's
    background first, the first opaque one last; white under them all)."""
    behind = (255.0, 255.0, 255.0)
    for layer in reversed(layers):
        behind = _over(parse_colour(layer), behind)
    r, g, b, a = parse_colour(colour)
    text = _over((r, g, b, a * opacity), behind)
    lum = [luminance("rgb({}, {}, {})".format(*c)) for c in (text, behind)]
    high, low = max(lum), min(lum)
    return (high + 0.05) / (low + 0.05)


def low_contrast(frame: Any, selector: str = "body") -> list[tuple[str, float]]:
    """Every visible text under ``selector`` (each match and what it holds) of a Playwright frame or
    page whose contrast is under :data:`MINIMUM`: ``(where, text, colours)``, ratio.

    :raises AssertionError: no text was found at all (the selector is wrong: nothing was checked).
    """
    found = [t for texts in frame.locator(selector).evaluate_all(f"els => els.map({_TEXTS})") for t in texts]
    assert found, f"no text under {selector}"
    low = []
    for where, text, colour, opacity, layers in found:
        ratio = contrast(colour, opacity, layers)
        if ratio < MINIMUM:
            low.append((f"{where} {text!r}: {colour} x{opacity:g} on {layers}", round(ratio, 2)))
    return low
