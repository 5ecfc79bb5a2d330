"""Lesson 04's findings: training through the cache, staging first or caching on first read, and the copy
the 2020 post made, beside parallel downloads and staging."""

from __future__ import annotations

from typing import Any

from dataferry.course.findings import Conclusion

__all__ = ["PAID", "SAME", "SOONER", "COSTS_LITTLE", "training", "copies"]

#: Epoch 1 at least this many times a later epoch paid the downloads.
PAID = 2.0
#: Two modes' later epochs within this factor read "the same local files" alike.
SAME = 1.25
#: One mode's epoch 1 (or first batch) this much shorter came "sooner".
SOONER = 1.1
#: The cache's re-read at this share of a plain copy read as wide, or more, "cost little".
COSTS_LITTLE = 0.8
MODES = ("stage, then train", "cache on first read")


def training(epochs: Any, *, prep_ms: float, workers: int, cpus: int, images: int, held_out: int, in_flight: int,
             repeats: int, where: str) -> Conclusion:
    """``epochs``: :func:`dataferry.course.lessontraining.train_through_cache`'s rows."""
    said = []
    e1 = epochs[epochs["epoch"] == 1].groupby("mode")["seconds"].median()
    later_rows = epochs[epochs["epoch"] > 1]
    if len(later_rows):
        later = later_rows.groupby("mode")["seconds"].median()
        for m in MODES:
            r = e1[m] / later[m]
            said.append(f"{m}: epoch 1 took {e1[m]:.2f} s, later epochs {later[m]:.3f} s: "
                        + (f"epoch 1 was {r:.0f}x slower; it alone paid the downloads and the workers' start."
                           if r >= PAID else f"epoch 1 was only {r:.2f}x the later epochs: the downloads were a small "
                           "part of it at this size."))
        a, b = later[MODES[0]], later[MODES[1]]
        said.append(f"After epoch 1 both modes read the same local files: {a:.3f} s and {b:.3f} s per epoch"
                    + (" (within 25%)." if max(a, b) / min(a, b) < SAME else
                       f" ({max(a, b) / min(a, b):.2f}x apart: with epochs this short, worker start-up and noise weigh in)."))
    else:
        said.append("EPOCHS is 1: rerun with EPOCHS >= 2 to compare epoch 1 with later epochs.")
    stage_s = epochs[(epochs["mode"] == MODES[0]) & (epochs["epoch"] == 1)]["stage_s"].median()
    quick, slow = sorted(MODES, key=lambda m: e1[m])
    said.append((f"Epoch 1 ended sooner with '{quick}' ({e1[quick]:.2f} s) than with '{slow}' ({e1[slow]:.2f} s)"
                 if e1[slow] > SOONER * e1[quick] else
                 f"Epoch 1 took about as long either way ({e1[quick]:.2f} s and {e1[slow]:.2f} s, within 10%)")
                + f"; staging alone took {stage_s:.2f} s with up to {in_flight} downloads in flight.")
    fb = epochs[epochs["epoch"] == 1].groupby("mode")["first_batch_s"].median()
    c, s = fb[MODES[1]], fb[MODES[0]]
    said.append(f"The first batch reached the model after {c:.2f} s caching on first read and {s:.2f} s staging first"
                + (": caching on first read started training sooner." if c < s / SOONER else
                   ": staging first brought the first batch sooner here." if s < c / SOONER else
                   ": within 10% of each other."))
    per_sample = (epochs.drop_duplicates(["mode", "repeat"])["downloads"] / epochs.drop_duplicates(["mode", "repeat"])[
        "samples"]).dropna()
    if len(per_sample):
        said.append(f"The server answered {per_sample.min():.2f}" + (f"-{per_sample.max():.2f}" if per_sample.min() !=
                    per_sample.max() else "") + f" downloads per sample per run ({workers} workers and the prefetcher "
                    "shared one cache): " + ("each object was downloaded once per run, never again in later epochs."
                                             if (per_sample == 1).all() else "more than once for some objects."))
    warm = later_rows if len(later_rows) else epochs
    wall, waiting, computing = warm["seconds"].median(), warm["waiting_s"].median(), warm["computing_s"].median()
    said.append(f"With the images local, an epoch took {wall:.2f} s: the step waited {waiting:.2f} s for data "
                f"({waiting / wall:.0%}) and the model alone needed {computing:.2f} s ({computing / wall:.0%}); the rest "
                f"is the model sharing this runtime's {cpus} CPUs with the workers, and the loop's own overhead.")
    supply = max(workers, 1) * 1000 / prep_ms
    need = images / computing
    said.append(f"Preparing one image (read, check, decode, resize, flip) took {prep_ms:.1f} ms on one core: {workers} "
                f"worker(s) supply at most {supply:.0f} images/s, the model alone takes {need:.0f} images/s: "
                + ("the workers, not the disk, set the pace (lesson 08 measures the fixes)." if supply < need else
                   "the workers could keep up, so the waiting had another cause (filling the pipeline at each epoch's "
                   "start, or the CPUs the workers share with the model)." if waiting / wall > 0.1 else
                   "the model set the pace."))
    acc = epochs.dropna(subset=["accuracy"]).groupby("mode")["accuracy"].median()
    scored = f"{acc.min():.0%}" if acc.min() == acc.max() else f"{acc.min():.0%}-{acc.max():.0%}"
    said.append(f"The model scored {scored} on {held_out} held-out images (median by mode; chance is 20% for five "
                "classes): " + ("it learnt to tell the flowers apart." if acc.min() >= 0.5 else
                                "better than a guess, far from learnt: more images or epochs would help."
                                if acc.min() >= 0.3 else "no better than a guess with so few images or epochs."))
    if repeats < 5:
        said.append(f"Only {repeats} run(s) per mode: these medians say little (the course's rule is at least 5).")
    return Conclusion(where, said)


def copies(rows: Any, files: int, trained_MBps: float | None, where: str) -> Conclusion:
    """``rows``: :func:`dataferry.course.lessontraining.compare_with_2020`'s; ``trained_MBps``: the training epochs'
    median after the first (None without them)."""
    ok = rows[(rows["phase"] == "epoch") & (rows["error"].fillna("") == "") & (rows["pass"] >= 1)]
    med = ok.groupby(["method", ok["pass"] >= 2])["MBps"].median()
    said = []
    if {("dataferry", False), ("api-serial", False)} <= set(med.index):
        r = med[("dataferry", False)] / med[("api-serial", False)]
        said.append(f"First read of {files} files: dataferry {med[('dataferry', False)]:.1f} MB/s, the 2020 post's "
                    f"one-by-one copy {med[('api-serial', False)]:.1f} MB/s: " +
                    (f"staging in parallel was {r:.1f}x faster; one by one pays a round trip per file." if r >= 1.5
                     else f"the one-by-one copy was {1 / r:.2f}x faster here." if r < 1 / 1.1
                     else f"only {r:.2f}x apart: no clear gain from parallel staging in this run."))
    if {("dataferry", False), ("api-parallel", False)} <= set(med.index):
        said.append(f"transfer_manager, 16 threads each downloading one file at a time, read it first at "
                    f"{med[('api-parallel', False)]:.1f} MB/s; dataferry's staging keeps every file's download in "
                    f"flight at once (up to 256), on one thread.")
    if {("dataferry", True), ("api-parallel", True)} <= set(med.index):
        cached, plain = med[("dataferry", True)], med[("api-parallel", True)]
        said.append(f"Re-read from local disk, as many at a time: through the cache {cached:.0f} MB/s, a plain copy "
                    f"{plain:.0f} MB/s ({cached / plain:.2f}x): " +
                    ("reading through the cache cost little." if cached >= COSTS_LITTLE * plain else
                     "the cache's checks and index cost something here."))
        if trained_MBps is not None:
            said.append(f"Training epochs after the first ran at {trained_MBps:.1f} MB/s: "
                        + ("the limit was the training loop (workers, decoding, the model), not the disk."
                           if trained_MBps < 0.5 * cached else "close to the speed of reading the disk."))
    return Conclusion(where, said)
