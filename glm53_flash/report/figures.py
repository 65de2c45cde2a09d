"""Charts for every report, one toolkit: the style, the palette (one colour per condition, the same on
every chart of the project), reference lines that stay inside the axis, error bars from the receipts'
intervals, and two outputs: PNG files for REPORT.md and inline SVG for the deck (text kept as text, so a
browser can measure it; each series tagged with its condition's name, so a test can check its colour).

Every chart function takes plain numbers (computed elsewhere: report/headline.py, the studies'
analysis) and returns a matplotlib Figure; nothing here reads a file or computes a statistic, and
save_png writes only through core.receipts.write_bytes.
"""

from __future__ import annotations

import io
import re
from contextlib import contextmanager
from pathlib import Path

# One colour per arm across every chart of the project.
ARM_COLOURS = {"faithful": "tab:orange", "ours": "tab:blue"}


def to_hex_colour(value) -> str:
    """Any matplotlib colour as '#rrggbb', the way the SVG writes it."""
    from matplotlib.colors import to_hex

    return to_hex(value)


# Smallest text on any chart, in points. A deck chart is drawn at 72 points per inch and shown at
# least at its natural size, so this is also its smallest text in CSS pixels.
MIN_FONT_PT = 11
STYLE = {
    "font.size": 12, "axes.titlesize": 12, "axes.labelsize": 12, "xtick.labelsize": MIN_FONT_PT,
    "ytick.labelsize": MIN_FONT_PT, "legend.fontsize": MIN_FONT_PT, "legend.title_fontsize": MIN_FONT_PT,
    "figure.titlesize": 13, "svg.fonttype": "none", "svg.hashsalt": "glm53-figures",
    "font.family": "sans-serif", "axes.spines.top": False, "axes.spines.right": False,
}
# The palette: one colour per condition across every chart (the deck's and the reports'), keyed by the
# condition's name. A colour means one thing: the arms keep ARM_COLOURS; the study
# conditions keep theirs on every slide; a difference between two conditions that no arm owns is drawn in
# EFFECT; RL seeds of one arm are shades of the arm's colour (seed_shades). A name not here has no colour:
# colour() says so, rather than letting matplotlib's cycle give it one that means something else.
PALETTE = {
    **{arm: to_hex_colour(value) for arm, value in ARM_COLOURS.items()},  # ours blue, faithful orange
    "original": "#d62728",           # the original miniature's published numbers: dashed red lines
    "before RL": "#8c8c8c",          # the model before RL: the pretrained checkpoint
    # the pretraining-data study's conditions
    "repeated-8": "#9467bd", "diverse-88": "#2ca02c", "diverse-blocked": "#8c564b", "curriculum-8-to-88": "#e377c2",
    # the RL-choices study: the baseline recipe, the two temperatures confirmed, every other arm of the screen;
    # the vision path's baseline is its own baseline architecture (the one the faithful one is measured against)
    "baseline": "#17becf", "temp-low": "#bcbd22", "temp-high": "#393b79", "other arms": "#c7c7c7",
    "effect": "#404040",             # a difference between conditions (a paired effect, a comparison)
}
BEFORE = PALETTE["before RL"]
REFERENCE = PALETTE["original"]
EFFECT = PALETTE["effect"]
UNTRAINED_HATCH = "///"  # families RL never saw: hatched bars
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


def colour(name: str) -> str:
    """The palette's colour of a condition (a hex string), or a ValueError naming the known ones."""
    if name not in PALETTE:
        raise ValueError(f"no colour for {name!r} in report/figures.PALETTE; known: {', '.join(sorted(PALETTE))}")
    return PALETTE[name]


def seed_shades(name: str, count: int) -> list[str]:
    """`count` shades of a condition's colour, darkest first: the RL seeds of one arm (the first is the
    condition's own colour, the others mixed towards white)."""
    from matplotlib.colors import to_rgb

    base = to_rgb(colour(name))
    return [to_hex_colour(tuple(c + (1 - c) * 0.55 * i / max(count - 1, 1) for c in base)) for i in range(count)]


SERIES_GID = "glm53-series-"


def series(name: str, *artists) -> None:
    """Tag the artists that draw one condition (lines, markers, bars; containers are opened) with its
    name: the deck's SVG carries it as data-series="NAME" on each, so a test can check that the condition
    has its palette colour and that a chart with several conditions has a legend."""
    flat, stack = [], list(artists)
    while stack:
        artist = stack.pop()
        if isinstance(artist, (tuple, list)):  # matplotlib's containers are tuples
            stack.extend(a for a in artist if a is not None)
        elif artist is not None:
            flat.append(artist)
    for artist in flat:
        fig = artist.figure
        while fig is not None and getattr(fig, "figure", fig) is not fig:  # a subfigure's root figure
            fig = fig.figure
        if fig is None:
            raise ValueError(f"series {name!r}: an artist not in a figure")
        tags = fig.__dict__.setdefault("_glm53_series", {})
        gid = f"{SERIES_GID}{len(tags)}"
        tags[gid] = name
        artist.set_gid(gid)


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
    tags = getattr(fig, "_glm53_series", {})
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
    from html import escape

    # each tagged series: its condition's name as data-series, in place of matplotlib's id for its group
    text = re.sub(rf'id="({SERIES_GID}\d+)"', lambda m: f'data-series="{escape(tags[m.group(1)])}"', text)
    text = re.sub(r'id="([^"]+)"', rf'id="{prefix}-\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}-\1)", text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}-\1"', text)
    return re.sub(r"\n\s*", "\n", text).strip()


__all__ = ["BEFORE", "EFFECT", "MIN_FONT_PT", "PALETTE", "REFERENCE", "UNTRAINED_HATCH", "colour", "include_in_axis",
           "interval_errors", "pyplot", "reference_line", "save_png", "seed_shades", "series", "shared_legend",
           "smallest_text_pt", "style", "to_hex_colour", "to_svg"]
