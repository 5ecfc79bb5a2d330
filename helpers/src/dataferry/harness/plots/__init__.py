"""Standard figures for benchmark results: throughput per method, first read vs repeat.

Rows are the long-format :class:`pandas.DataFrame` of :data:`dataferry.harness.results.COLUMNS`. The
figures use only ``phase == "epoch"`` rows whose ``error`` is empty: one epoch row is one whole
pass over the data, so its ``MBps`` is what training sees. Throughput spans orders of magnitude
between methods, so every y axis is logarithmic, and every box is labelled with its sample size so
a box drawn from two points is not mistaken for a solid result.

A box never pools two regions or two file sizes (nor two lessons, when rows carry a ``lesson``
column): figures draw a panel per region and file size, regions nearest first, and :func:`save`
records in the PNG what each box holds (:func:`box_provenance` reads it back). Each method keeps one
colour in every figure (:func:`method_palette`). Figures from the offline lab (regions ``lab:...``)
say so in a footnote: they are not cloud measurements.

Figures are created through pyplot, which picks a backend only if none is configured (Agg on a
machine without a display, the inline backend in Jupyter), and are detached from pyplot at once:
nothing here calls ``matplotlib.use`` or ``plt.show``, a returned figure is shown once when it is
the last expression of a notebook cell, and loops that draw many figures do not keep them alive.
"""

from dataferry.harness.plots.figures import (NO_DATA, Y_LABEL, au_by_method, by_region, by_runtime, first_vs_repeat,
                                     log_axis, per_epoch, save, standard_figures)
from dataferry.harness.plots.dots import finish, medians_and_dots
from dataferry.harness.plots.lessons import (archive_times, cache_budget, epoch_times, gcsfuse_knobs, layouts,
                                     listing_times, save_times, shards_disk_and_network, warm_vs_cold)
from dataferry.harness.plots.palette import METHOD_ORDER, method_palette
from dataferry.harness.plots.settings import LAB_NOTE, LAB_REGIONS_BY_DISTANCE, PASS_KINDS, box_provenance, region_order

__all__ = [
    "METHOD_ORDER",
    "archive_times",
    "cache_budget",
    "listing_times",
    "epoch_times",
    "gcsfuse_knobs",
    "layouts",
    "save_times",
    "shards_disk_and_network",
    "warm_vs_cold",
    "method_palette",
    "first_vs_repeat",
    "by_region",
    "by_runtime",
    "per_epoch",
    "au_by_method",
    "medians_and_dots",
    "finish",
    "save",
    "standard_figures",
    "log_axis",
    "box_provenance",
    "region_order",
    "LAB_NOTE",
    "LAB_REGIONS_BY_DISTANCE",
    "PASS_KINDS",
    "NO_DATA",
    "Y_LABEL",
]
