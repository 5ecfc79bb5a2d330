"""Ready-made experiments: first vs repeated reads by method and region, at equal reader widths.

Every figure states the cache state of each pass and where it ran; lab runs are labelled
``lab:<profile>`` and are not cloud numbers. The lab's own runs of these experiments live with the
lab (:mod:`dataferry.course.lab.methodsbench`, and the cache's benchmark in :mod:`benchmarks.cache`):
this package never imports the lab.

- :mod:`~dataferry.harness.bench.methods`: :class:`Target` and :func:`compare_methods`;
- :mod:`~dataferry.harness.bench.source`: :func:`source_target`, :func:`bench_source`, :func:`measure`;
- :mod:`~dataferry.harness.bench.report`: :func:`summary`, :func:`summary_table`, :func:`say_failures`;
- :mod:`~dataferry.harness.bench.ways`: :func:`interleave` (any ways, timed side by side in shuffled rounds), :func:`medians`.
"""

from dataferry.harness.bench.methods import KNOWN_METHODS, LAB_METHODS, PARALLEL_WORKERS, Target, check_methods, compare_methods
from dataferry.harness.bench.report import say_failures, summary, summary_table
from dataferry.harness.bench.source import bench_source, measure, source_target
from dataferry.harness.bench.ways import Turn, interleave, medians

__all__ = ["compare_methods", "check_methods", "KNOWN_METHODS", "measure", "source_target", "bench_source", "Target", "LAB_METHODS",
           "PARALLEL_WORKERS", "summary", "summary_table", "say_failures", "interleave", "medians", "Turn"]
