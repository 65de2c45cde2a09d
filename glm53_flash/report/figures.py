"""Charts for every report, one toolkit: the style, the colours of trained and untrained families,
reference lines that stay inside the axis, error bars from the receipts' intervals, and two outputs:
PNG files for REPORT.md and inline SVG for the deck (text kept as text, so a browser can measure it).

Every chart function takes plain numbers (computed elsewhere: report/headline.py, the studies'
analysis) and returns a matplotlib Figure; nothing here reads a file or computes a statistic.
"""

from __future__ import annotations

import io
import re
from contextlib import contextmanager

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


def save_png(fig, path, dpi: int = PNG_DPI) -> None:
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    pyplot().close(fig)


def to_svg(fig, prefix: str) -> str:
    """Inline SVG (no XML prologue, no fixed size: the page sizes it), ids prefixed to stay unique in a
    page holding several charts. Deterministic: no date, fixed hash salt."""
    buffer = io.StringIO()
    with pyplot().rc_context({"svg.fonttype": "none", "svg.hashsalt": "glm53-figures"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    pyplot().close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
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
