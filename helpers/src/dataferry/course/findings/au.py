"""Lesson 08's findings: will the accelerator starve? Utilisation (AU) per way of reading, judged in the steady
state against MLPerf Storage's thresholds, and what decoding costs once the files are local."""

from __future__ import annotations

from typing import Any

from dataferry.harness.feed import PREFETCH_FACTOR
from dataferry.course.findings import MIN_REPEATS, Conclusion, listed, percent, where_said

__all__ = ["MLPERF", "ONCE_READS_MORE", "target_for", "steady", "utilisation", "decoding"]

#: MLPerf Storage's AU thresholds by workload: a storage system passes when the accelerators stay busy at
#: least this share of the time (ResNet-50 and U-Net3D 90%, CosmoFlow 70%).
MLPERF = {"resnet": 0.9, "unet": 0.9, "cosmoflow": 0.7}

#: Decode-once's pictures are said to be read from the disk, beside the JPEGs, when they are at least this many times
#: a JPEG's bytes (a 256-pixel picture is about 8x a flower JPEG).
ONCE_READS_MORE = 2.0


def target_for(model: str) -> tuple[float, str]:
    """The AU threshold for a model, and whose it is: MLPerf Storage's for its workload; for another model
    its ResNet-50 threshold, said so."""
    name = model.lower().replace("-", "")
    for key, share in MLPERF.items():
        if key in name:
            return share, f"MLPerf Storage's {share:.0%} for {model.split(',')[0]}"
    return 0.9, "MLPerf Storage's 90% for ResNet-50 (this model has no threshold of its own)"


def steady(rows: Any, batch_size: int) -> Any:
    """Each train row's AU once its pipeline was full (``first_byte_ns``: the time of the first step and of the
    ``concurrency x 2`` batches the workers fetched ahead); NaN for an epoch no longer than that fill, whose
    batches were all fetched ahead: its later steps barely wait whatever the source, so it has no steady state."""
    import numpy as np

    steps = np.ceil(rows["samples"] / batch_size)
    fill = 1 + PREFETCH_FACTOR * rows["concurrency"].fillna(0)
    compute = rows["au"] * rows["ns"]
    rest = rows["ns"] - rows["first_byte_ns"]
    return (compute * (steps - fill) / steps / rest).where((rest > 0) & (steps > fill))


def _interval(low: float, high: float, at: float) -> str:
    """A 95% interval, each bound as :func:`~dataferry.course.findings.percent` gives it against the threshold ``at``,
    so that a printed bound never sits on the other side of it than the verdict beside it says (a low of 89.74%
    printed as 90% beside "straddles 90%", a high of 89.7% printed as 90% beside "below 90%")."""
    return f"[95% CI {percent(low, at)}, {percent(high, at)}]"


def _ci(values: Any) -> tuple[float, float]:
    from dataferry.harness.stats import bootstrap_median_ci

    return bootstrap_median_ci(values) if len(values) >= MIN_REPEATS else (float("nan"), float("nan"))


def utilisation(rows: Any, profile: Any, region: str, methods: list[str], repeats: int, batch_size: int) -> Conclusion:
    """``rows``: the ``train`` rows of one compute ``profile`` in one ``region``; verdicts from epochs after the
    first, in the steady state (the first step's wait apart), each method's median against the profile's
    threshold with its 95% interval over the runs."""
    at, whose = target_for(profile.model)
    ok = rows[(rows["error"].fillna("") == "") & (rows["pass"] >= 1)].assign(steady_au=lambda r: steady(r, batch_size))
    said = [f"{profile.name} ({profile.samples_per_s:.0f} samples/s); the threshold is {whose}."]
    passing, failing, unsure, short, at_start = [], [], [], [], []
    for m in methods:
        mine = ok[ok["method"] == m]
        if mine.empty:
            continue
        e1, later = mine[mine["pass"] == 1], mine[mine["pass"] > 1]
        values = later["steady_au"].dropna()
        if values.empty:
            short.append(m)
            continue
        med, (low, high) = values.median(), _ci(values)
        said.append(f"{m}: AU {percent(e1['au'].median(), at)} in epoch 1, {percent(later['au'].median(), at)} in later "
                    f"epochs, {percent(med, at)} once their pipeline was full"
                    + (f" {_interval(low, high, at)}." if low == low else ", too few runs for an interval."))
        if low == low and low >= at:
            passing.append(m)
            if later["au"].median() < at:
                at_start.append(f"{m}: at or above {at:.0%} only once the pipeline was full: its later epochs as a whole "
                                f"ran at {percent(later['au'].median(), at)}, against {med:.0%} once it was full (the difference is each "
                                "epoch's start, the first step and the batches fetched ahead; an epoch of many more steps "
                                "spreads it thin).")
        elif low == low and high < at:
            failing.append(m)
        else:
            unsure.append(m)
    if passing or failing:
        said.append(f"In the steady state, at or above {at:.0%}: {', '.join(passing) or 'no method'}; below it: "
                    f"{', '.join(failing) or 'no method'}" + (f"; not told: {', '.join(unsure + short)}." if unsure + short else "."))
    said += at_start
    if unsure:
        said.append(f"{', '.join(unsure)}: the interval straddles {at:.0%} (or rests on too few runs), so this run "
                    "cannot say; raise REPEATS.")
    if short:
        said.append(f"{', '.join(short)}: later epochs no longer than the pipeline's fill (the first step and the "
                    "batches the workers fetch ahead) have no steady state, so this run cannot say; raise N_FILES.")
    copies = [m for m in ("stage", "cache") if m in passing + failing + unsure]  # they read local copies after epoch 1
    if "local" in failing:
        said.append("Even local disk stayed below the threshold in the steady state: a faster source alone would not "
                    "keep this accelerator busy on this runtime; the disk or the work after it (the workers, their "
                    "CPUs) is the limit, and this run does not tell them apart.")
    elif not passing and "local" not in unsure and copies and all(m in failing for m in copies):
        said.append(f"Even reading the cache's copies on local disk ({', '.join(copies)}) stayed below the threshold "
                    "in the steady state: a faster source alone would not keep this accelerator busy on this runtime; "
                    "the disk or the work after it (the workers, their CPUs) is the limit, and this run does not tell "
                    "them apart.")
    if repeats < 5:
        said.append(f"Only {repeats} run(s) of every method: these medians say little (the course's rule is at least 5).")
    return Conclusion(where_said(region), said)


def _busy(whole: float, steady: Any) -> str:
    """What the fastest decoder did for the accelerator: judged against 90% once its pipeline was full, by the 95%
    interval of its later epochs' steady AU (as the ways of reading are, over runs); by whole epochs (``whole``, the
    median) where the rows have no steady figure."""
    values = steady.dropna() if steady is not None else None
    if values is None or values.empty:
        return ("it kept the accelerator busy at least 90% of the time." if whole >= 0.9 else
                f"even so the accelerator waited {1 - whole:.0%} of the time, every image already on local disk.")
    med, (low, high) = values.median(), _ci(values)
    if low != low:
        return (f"once the pipeline was full its AU was {med:.0%}, over too few epochs for an interval: this run cannot "
                "say whether it kept the accelerator busy; raise DECODE_EPOCHS.")
    if low >= 0.9:
        return (f"once the pipeline was full it kept the accelerator busy at least 90% of the time (AU {percent(med, 0.9)} "
                f"{_interval(low, high, 0.9)}; whole epochs: {whole:.0%}).")
    if high < 0.9:
        return (f"even so, once the pipeline was full, the accelerator waited {1 - med:.0%} of the time (AU {percent(med, 0.9)} "
                f"{_interval(low, high, 0.9)}), every image already on local disk.")
    return (f"once the pipeline was full its AU was {percent(med, 0.9)} {_interval(low, high, 0.9)}, an interval that straddles "
            "90%: this run cannot say whether it kept the accelerator busy; raise DECODE_EPOCHS.")


def decoding(rows: Any, workers: int, cpus: int, fed: str, where: str) -> Conclusion:
    """``rows``: :func:`dataferry.harness.bench.decoders.compare_decoders`'s, per decoder and epoch; epochs after the
    first are compared, the fastest judged once its pipeline was full (``steady_au``, where the rows have it). A
    one-core cost that implies fewer images/s than the loop ran is a measurement error, said as such."""
    from dataferry.harness.bench.decoders import decoder_gains, on_gpu

    where = where_said(where)

    later = rows[rows["epoch"] > 1].groupby("decoder", sort=False)
    if not len(later):
        return Conclusion(where, ["DECODE_EPOCHS is 1: every epoch measured started its workers; raise it to 2 or "
                                  "more to compare decoders."])
    rate, au = later["samples_per_s"].median(), later["au"].median()
    steady = later["steady_au"].median() if "steady_au" in rows.columns else au * float("nan")

    def aus(d: str) -> str:  # whole epochs, and once the pipeline was full where the rows say
        return f"AU {au[d]:.0%}" + (f", {steady[d]:.0%} once the pipeline was full" if steady[d] == steady[d] else "")

    ms = rows.groupby("decoder", sort=False)["decode_ms_per_sample"].first()
    said = [f"{cpus} CPUs, {workers} workers, feeding {fed}. PIL, as ImageFolder decodes: {rate['pil']:.0f} images/s, "
            f"{aus('pil')}."]
    for d in rate.index:
        ceiling = workers * 1000 / ms[d]
        if not on_gpu(d) and ceiling < 0.95 * rate[d]:
            said.append(f"{d}'s one-core cost, {ms[d]:.2f} ms, allows at most {ceiling:.0f} images/s from {workers} "
                        f"workers, yet the loop ran at {rate[d]:.0f}: a measurement error in that cost (the machine was "
                        "busier while it was timed); its cost is not used below.")
    gains = decoder_gains(rows.to_dict("records"))
    for d, (g, low, high) in gains.items():
        if d != "pil":
            said.append(f"{d}: {g:.2f}x PIL's images/s [95% CI {low:.2f}, {high:.2f}]"
                        + (": not told apart from PIL" if low <= 1 <= high else "") + f"; {aus(d)}.")
    ranked = sorted(gains, key=lambda d: gains[d][0], reverse=True)
    best = ranked[0]
    # decoders whose intervals overlap the fastest's (not PIL: the fastest's own interval says that, above)
    tied = [d for d in ranked[1:] if d != "pil" and gains[d][2] >= gains[best][1]]
    said.append(f"The fastest by images/s was {best}" + (f" ({gains[best][0]:.2f}x PIL)" if best != "pil" else "")
                + (f", not told apart from {listed(tied, 'or')} by this run" if tied else "") + ": "
                + _busy(au[best], rows[(rows["epoch"] > 1) & (rows["decoder"] == best)].get("steady_au")))
    if "bytes_per_sample" in rows.columns and "pil" in rate.index:  # what decode-once pays for decoding nothing
        size, state = later["bytes_per_sample"].median(), later["cache_state"].agg(lambda s: s.mode().iloc[0])
        for d in rate.index:
            if d.startswith("decode-once") and state[d] == "local_copy" and size[d] >= ONCE_READS_MORE * size["pil"]:
                said.append(f"{d} read {size[d] / 1e3:.0f} KB an image from local disk in each later epoch, "
                            f"{size[d] / size['pil']:.1f}x a JPEG's {size['pil'] / 1e3:.0f} KB (the page cache dropped "
                            f"before each epoch, as for a data set larger than memory): {rate[d] * size[d] / 1e6:.0f} "
                            f"MB/s at its {rate[d]:.0f} images/s, against {rate['pil'] * size['pil'] / 1e6:.0f} MB/s "
                            "for PIL.")
    slack = [d for d in rate.index if not on_gpu(d) and workers * 1000 / ms[d] > 2 * rate[d]]
    if slack:
        what = " (for decode-once, only its crop and flip: it decodes nothing after epoch 1)" if any(
            d.startswith("decode-once") for d in slack) else ""
        said.append(f"For {listed(slack, 'and')}, {workers} workers at their one-core costs could go more than twice as fast as the loop "
                    f"ran: decoding{what} is only part of an image's cost here; the rest (reading, collating, handing "
                    "batches over, the CPUs the workers share) is not profiled in this lesson.")
    return Conclusion(where, said)
