"""The timing harness: honest cold and warm measurements of any way of reading, tidy results, standard figures.

It builds on the library (``dataferry``'s sources, cache and datasets) and never imports the course:

- ``pagecache``: cache-state control (drop or evict pages, residency probes);
- ``timing``: timed reads, host-to-device copies;
- ``results``: the results files, written as measured and read back;
- ``stats``: medians, bootstrap intervals, speedups;
- ``plots``: the standard figures;
- ``bench``: ready-made experiments: first vs repeated reads by method, decoders, interleaved rounds;
- ``feed``: a training loop's feed against an emulated or real accelerator, and its utilisation;
- ``utilisation``: accelerator utilisation by method and epoch;
- ``runtime``: what this runs on and in which region;
- ``folders``: listings, copies and reads of local folders, timed.
"""
