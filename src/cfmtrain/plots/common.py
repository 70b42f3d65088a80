"""Shared figure plumbing: Agg backend, variant colours and labels, atomic PNG+PDF output."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from cfmtrain.atomic import atomic_path  # noqa: E402
from cfmtrain.paper import ALL_VARIANTS, BALANCER, BASELINE, BOTH, KERNEL, MATCHED  # noqa: E402

VARIANT_ORDER = tuple(v.name for v in (BASELINE, MATCHED, BALANCER, KERNEL, BOTH))
VARIANT_LABELS = {v.name: v.label for v in ALL_VARIANTS}
VARIANT_COLORS = {v.name: v.colour for v in ALL_VARIANTS}
SIMULATED_NOTE = "SIMULATED (cost model fitted on this machine's runs; not measured)"
CONTENDED_NOTE = "contended cell (summary.json): re-measure with --forcerun"


def ordered(variants) -> list[str]:
    """Variants in the canonical order, unknown ones last (alphabetically)."""
    known = [v for v in VARIANT_ORDER if v in set(variants)]
    return known + sorted(set(variants) - set(known))


def label(variant: str) -> str:
    return VARIANT_LABELS.get(variant, variant)


def color(variant: str) -> str | None:
    return VARIANT_COLORS.get(variant)


def mark_simulated(fig: plt.Figure) -> None:
    """A visible banner so that a simulated figure is never mistaken for a measured one."""
    fig.text(0.5, 1.0, SIMULATED_NOTE, ha="center", va="bottom", fontsize=9, color="tab:red",
             weight="bold")


def contended_handle(hatched: bool = False):
    """The legend entry of contended cells: a hatched patch (bars) or a red ring (lines)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if hatched:
        return Patch(facecolor="white", edgecolor="black", hatch="//")
    return Line2D([], [], ls="", marker="o", ms=11, mfc="none", mec="tab:red", mew=1.5)


def mark_contended(ax: plt.Axes, x, y) -> None:
    """Red rings around the points of contended cells."""
    ax.plot(x, y, ls="", marker="o", ms=11, mfc="none", mec="tab:red", mew=1.5)


def mark_unsupported(ax: plt.Axes, reason: str) -> None:
    """The statement a simulated figure makes instead of a headline when its fit is too weak."""
    ax.text(0.5, 0.5, f"unsupported — {reason}", transform=ax.transAxes,
            ha="center", va="center", wrap=True, fontsize=10, color="tab:red", weight="bold",
            bbox={"facecolor": "white", "edgecolor": "tab:red", "alpha": 0.9})


def save(fig: plt.Figure, output: str | Path) -> list[Path]:
    """Write `output` (PNG) and the PDF beside it atomically; close the figure."""
    output = Path(output)
    if output.suffix not in (".png", ".pdf"):
        raise ValueError(f"{output}: figure output must end in .png or .pdf")
    written = []
    for suffix in (".png", ".pdf"):
        path = output.with_suffix(suffix)
        image = io.BytesIO()  # drawn in memory: on a full disk matplotlib's PDF writer fails
        fig.savefig(image, dpi=130, format=suffix[1:], bbox_inches="tight")  # with zlib's error
        with atomic_path(path) as tmp:
            tmp.write_bytes(image.getvalue())
        written.append(path)
    plt.close(fig)
    return written
