"""Charts for every report, one toolkit: the style, the colours of trained and untrained families,
reference lines that stay inside the axis, error bars from the receipts' intervals, and two outputs:
PNG files for REPORT.md and inline SVG for the deck (text kept as text, so a browser can measure it).

Every chart function takes plain numbers (computed elsewhere: report/headline.py, the studies'
analysis) and returns a matplotlib Figure; nothing here reads a file or computes a statistic, and
save_png writes only through core.receipts.write_bytes.
"""

from __future__ import annotations

import io
import re
from contextlib import contextmanager
from pathlib import Path

# Smallest text on any chart, in points. A deck chart is drawn at 72 points per inch and shown at
# least at its natural size, so this is also its smallest text in CSS pixels.
MIN_FONT_PT = 11
STYLE = {
    "font.size": 12, "axes.titlesize": 12, "axes.labelsize": 12, "xtick.labelsize": MIN_FONT_PT,
    "ytick.labelsize": MIN_FONT_PT, "legend.fontsize": MIN_FONT_PT, "legend.title_fontsize": MIN_FONT_PT,
    "figure.titlesize": 13, "svg.fonttype": "none", "svg.hashsalt": "glm53-figures",
    "font.family": "sans-serif", "axes.spines.top": False, "axes.spines.right": False,
}
BEFORE = "0.55"  # grey: the model before RL
TRAINED = "tab:green"  # families RL trained on: solid bars
UNTRAINED = "tab:purple"  # families RL never saw: hatched bars
UNTRAINED_HATCH = "///"
REFERENCE = "tab:red"  # published numbers of the original miniature: dashed lines
SEED_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
                "tab:olive", "tab:cyan")
PNG_DPI = 110


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextmanager
def style():
    plt = pyplot()
    with plt.rc_context(STYLE):
        yield plt


def seed_colour(index: int) -> str:
    return SEED_COLOURS[index % len(SEED_COLOURS)]


def include_in_axis(ax, values, axis: str = "y", pad: float = 0.05) -> None:
    """Widen the axis so every value (reference lines, interval ends) lies inside it."""
    values = [v for v in values if v is not None]
    if not values:
        return
    low, high = ax.get_ylim() if axis == "y" else ax.get_xlim()
    span = max(high - low, 1e-9)
    new_low = min(low, min(values) - pad * span) if min(values) < low else low
    new_high = max(high, max(values) + pad * span) if max(values) > high else high
    (ax.set_ylim if axis == "y" else ax.set_xlim)(new_low, new_high)


def reference_line(ax, value: float, label: str, axis: str = "y") -> None:
    """A dashed reference line that the axis limits always include."""
    line = ax.axhline if axis == "y" else ax.axvline
    line(value, color=REFERENCE, linestyle="--", linewidth=1.5, label=label)
    include_in_axis(ax, [value], axis)


def interval_errors(centres, intervals) -> list[list[float]]:
    """matplotlib's asymmetric error format from (centre, [low, high]) pairs; missing intervals -> 0."""
    lower = [c - i[0] if i else 0.0 for c, i in zip(centres, intervals)]
    upper = [i[1] - c if i else 0.0 for c, i in zip(centres, intervals)]
    return [[max(0.0, v) for v in lower], [max(0.0, v) for v in upper]]


def shared_legend(fig, handles=None, columns: int = 5) -> None:
    """One legend for the whole figure, outside every axis (under it), naming each label once: the
    labelled artists of all axes, or the handles given. Needs a figure with layout="constrained"."""
    if handles is None:
        seen = {}
        for ax in fig.axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(label, handle)
        handles = list(seen.values())
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(columns, len(handles)), frameon=False)


def smallest_text_pt(fig) -> float:
    """The smallest font size (points) of any visible, non-empty text in the figure."""
    from matplotlib.text import Text

    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes) if sizes else MIN_FONT_PT


def save_png(fig, path, dpi: int = PNG_DPI, *, within=None) -> None:
    """The figure as a PNG file, written atomically and never through a symbolic link (and, given
    `within`, only inside that directory: core.receipts.write_bytes)."""
    from glm53_flash.core.receipts import write_bytes

    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix[1:].lower() or "png", dpi=dpi, metadata={"Software": None})
    pyplot().close(fig)
    write_bytes(path, buffer.getvalue(), within=within)


# The SVG properties matplotlib writes in style attributes, each also a presentation attribute; and the
# elements that draw strokes, which take the defaults of matplotlib's `*{...}` style element.
PRESENTATION_ATTRIBUTES = frozenset((
    "clip-path", "color", "dominant-baseline", "fill", "fill-opacity", "fill-rule", "font-family", "font-size",
    "font-stretch", "font-style", "font-variant", "font-weight", "letter-spacing", "opacity", "stroke",
    "stroke-dasharray", "stroke-dashoffset", "stroke-linecap", "stroke-linejoin", "stroke-miterlimit",
    "stroke-opacity", "stroke-width", "text-anchor", "visibility"))
_SHAPES = re.compile(r"<(path|use|rect|line|polyline|polygon|circle|ellipse)\b([^>]*?)(/?)>")


def _declarations(text: str, where: str) -> dict[str, str]:
    found = {}
    for declaration in filter(None, (part.strip() for part in text.split(";"))):
        name, _, value = declaration.partition(":")
        name = name.strip()
        if name not in PRESENTATION_ATTRIBUTES:
            raise ValueError(f"{where} sets {name!r}, which has no SVG presentation attribute "
                             f"({', '.join(sorted(PRESENTATION_ATTRIBUTES))})")
        found[name] = value.strip()
    return found


def _without_inline_styles(text: str) -> str:
    """The SVG with every style attribute as presentation attributes and matplotlib's style element
    (defaults for every element) as attributes of each shape that sets none of its own: the same
    drawing, with nothing a content security policy must allow as inline style."""
    defaults = {}
    for rule in re.findall(r"<style[^>]*>(.*?)</style>", text, flags=re.S):
        star = re.fullmatch(r"\s*\*\s*\{([^}]*)\}\s*", rule)
        if star is None:
            raise ValueError(f"matplotlib wrote a style element other than one '*' rule: {rule!r}")
        defaults.update(_declarations(star.group(1), "matplotlib's style element"))
    text = re.sub(r"<style[^>]*>.*?</style>", "", text, flags=re.S)
    text = re.sub(r'\sstyle="([^"]*)"', lambda m: "".join(f' {name}="{value}"' for name, value in
                                                          _declarations(m.group(1), "a style attribute").items()), text)

    def shape(match):
        missing = "".join(f' {name}="{value}"' for name, value in defaults.items()
                          if not re.search(rf"\s{name}=", match.group(2)))
        return f"<{match.group(1)}{match.group(2)}{missing}{match.group(3)}>"

    return _SHAPES.sub(shape, text) if defaults else text


def to_svg(fig, prefix: str) -> str:
    """Inline SVG (no XML prologue, no fixed size: the page sizes it), ids prefixed to stay unique in a
    page holding several charts, styles as presentation attributes (no inline style for the page's
    content security policy to allow). Deterministic: no date, fixed hash salt."""
    buffer = io.StringIO()
    with pyplot().rc_context({"svg.fonttype": "none", "svg.hashsalt": "glm53-figures"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    pyplot().close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = _without_inline_styles(text)
    width = re.search(r'<svg[^>]*\swidth="([\d.]+)pt"', text).group(1)
    text = re.sub(r'(<svg[^>]*?)\swidth="[\d.]+pt" height="[\d.]+pt"', r"\1", text, count=1)
    text = re.sub(r'\sxmlns(:xlink)?="[^"]*"', "", text)  # inline in HTML: the parser knows both namespaces
    # scaled into a taller box, the drawing keeps its aspect and sits at the box's top
    text = text.replace("<svg ", f'<svg class="chart" data-natural-width="{width}" preserveAspectRatio="xMidYMin meet" ', 1)
    text = re.sub(r'id="([^"]+)"', rf'id="{prefix}-\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}-\1)", text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}-\1"', text)
    return re.sub(r"\n\s*", "\n", text).strip()


__all__ = ["BEFORE", "MIN_FONT_PT", "REFERENCE", "TRAINED", "UNTRAINED", "UNTRAINED_HATCH", "include_in_axis",
           "interval_errors", "pyplot", "reference_line", "save_png", "seed_colour", "shared_legend", "smallest_text_pt",
           "style",
           "to_svg"]
