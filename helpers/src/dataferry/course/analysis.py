"""The analysis lesson's reading of pooled runs: pool the result files, compare like with like, and test
the 2020 post's three findings against them.

A **setting** is a lesson, a file count, an exact mean file size, a region and a runtime kind
(:data:`SETTING`): rows that differ in any of these are never pooled. :func:`pool` gathers every
``results.csv`` under some folders, each row labelled with the lesson that measured it;
:func:`label_epochs` keeps the usable epoch rows and adds their setting's columns; :class:`Findings`
prints, setting by setting, each of the post's findings in its own words next to what the rows say,
what they cannot test, and the course's conclusion. A fastest way of reading is named only when it
leads the next by :data:`LEAD`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from dataferry.course.findings import listed, percent
from dataferry.course.shipped import post_quote
from dataferry.harness.results import load_results, size_text

__all__ = ["LEAD", "LOCAL_COPY", "SETTING", "Findings", "exact_size_label", "label_epochs", "pool"]

#: Ways of reading whose re-reads read a copy on local disk.
LOCAL_COPY = {"local", "dataferry", "api-serial", "api-parallel", "gcsfuse-cache"}
#: Like with like: rows that differ in any of these are never pooled.
SETTING = ["lesson", "files", "size", "region", "runtime"]
#: A fastest way of reading is named only when it leads the next by this much.
LEAD = 1.2
#: Accelerator utilisation at which reading no longer holds training back (MLPerf Storage's threshold for
#: ResNet-50 and U-Net3D).
AU_TARGET = 0.9
#: gcsfuse without its file cache re-reading under this many times its first read re-reads "about as slowly".
GCSFUSE_AGAIN = 1.5
#: Two readers' median AU within this of each other are tied.
AU_TIE = 0.02
#: Fewer later epochs than this of a reader in a setting are said to be too few.
AU_MIN_RUNS = 3

Say = Callable[[str], Any]


def pool(folders: Iterable[tuple[str | Path, str | None]], say: Say = print) -> Any:
    """Every readable ``results.csv`` under each folder (None if there is none), each row labelled with
    the lesson that measured it: the folder's label if given, else the first folder under the pooled one
    (an unzipped ``course.finish()`` download, ``results/<lesson>/...``, by its lesson). A file that cannot
    be read is said and skipped; a row pooled twice (each lesson's download holds everything measured
    before it) counts once."""
    import pandas as pd

    frames = []
    for folder, lesson in ((Path(f), label) for f, label in folders):
        files = sorted(folder.rglob("results.csv")) if folder.is_dir() else []
        if not files:
            say(f"(nothing to pool in {folder})")
        for f in files:
            parts = f.relative_to(folder).parts
            if parts[0] == "results" and len(parts) > 2:
                parts = parts[1:]
            if len(parts) == 1:  # a results.csv straight in the folder: the folder names the run
                parts = (folder.name,)
            try:
                frames.append(load_results(f).assign(lesson=lesson or parts[0]))
            except (ValueError, OSError) as e:
                say(f"(skipped {f}: {e})")
    if not frames:
        return None
    pooled = pd.concat(frames, ignore_index=True)
    return pooled.drop_duplicates(subset=[c for c in pooled.columns if c != "lesson"], ignore_index=True)


def usable_epochs(rows: Any) -> Any:
    """The epoch rows that measured something: no error, a pass, bytes moving."""
    if rows is None:
        return rows
    ok = (rows["phase"] == "epoch") & (rows["error"] == "") & (rows["pass"] >= 1) & (rows["MBps"] > 0)
    return rows[ok.fillna(False)]


def exact_size_label(mean_bytes: float) -> str:
    """The mean file size, exact to the byte: a round binary size by its name, any other in bytes."""
    import math

    if not math.isfinite(mean_bytes):
        return "size unknown"
    b = mean_bytes
    return f"{size_text(b)} files" if b == round(b) and int(b) & (int(b) - 1) == 0 else f"{b:,.0f} B files"


def label_epochs(rows: Any) -> Any:
    """The usable epoch rows of ``rows`` with their setting's columns: ``kind`` (first read or repeat),
    ``files`` (the run's file count, from its ``file`` label) and ``size`` (:func:`exact_size_label` of the mean)."""
    import numpy as np

    ep = usable_epochs(rows)
    if ep is None or ep.empty:
        return ep
    n_files = ep["file"].str.extract(r"\((\d+) files\)")[0].astype(float)
    return ep.assign(kind=np.where(ep["pass"] == 1, "first read", "repeat"), files=n_files.fillna(0).astype(int),
                     size=(ep["bytes"].astype(float) / n_files).map(exact_size_label))


def _leader(medians: Any) -> tuple[Any, Any]:
    """The method with the highest median if it leads the next by :data:`LEAD`, else None; and the next one."""
    ranked = medians.sort_values(ascending=False)
    if len(ranked) < 2:
        return None, None
    return (ranked.index[0] if ranked.iloc[0] >= LEAD * ranked.iloc[1] else None), ranked.index[1]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _named(setting: Sequence[Any]) -> str:
    lesson, files, size, region, runtime = setting
    return f"{region}, {lesson}, {files} files ({size}), {runtime}"


def _no_distance(region: str) -> float | None:
    return None


class Findings:
    """The findings of labelled epoch rows (:func:`label_epochs`), setting by setting: the per-method median
    MB/s of first reads (``first``) and re-reads (``again``), and what the rows cannot test (``cannot``,
    filled by :meth:`against_the_post`). ``distance`` gives a region's added round trip in ms when it is
    known (a lab profile's: ``dataferry.course.lab.profiles.added_rtt_ms``), else None; regions of known
    distance are compared nearest against farthest, others fastest against slowest."""

    def __init__(self, epochs: Any, distance: Callable[[str], float | None] = _no_distance,
                 train: Any = None) -> None:
        self.ep, self.distance, self.train = epochs, distance, train
        self.first = epochs[epochs["kind"] == "first read"].groupby([*SETTING, "method"])["MBps"].median()
        self.again = epochs[epochs["kind"] == "repeat"].groupby([*SETTING, "method"])["MBps"].median()
        self.settings = sorted(set(map(tuple, epochs[SETTING].itertuples(index=False))))
        self.regions = sorted(epochs["region"].unique())
        self.runtimes = sorted(epochs["runtime"].unique())
        self.lab_regions = [r for r in self.regions if r.startswith("lab:")]
        self.cannot: list[str] = []

    def __repr__(self) -> str:
        return f"<Findings {len(self.ep)} epoch rows in {len(self.settings)} settings>"

    def at(self, series: Any, setting: tuple) -> Any:
        """The per-method medians of one setting (empty if it has none)."""
        import pandas as pd

        return series.xs(setting, level=SETTING) if setting in series.index.droplevel("method") else pd.Series(dtype=float)

    def against_the_post(self, say: Say = print) -> list[str]:
        """Print each of the post's three findings in its words, then what every setting says of it; returns
        (and keeps in ``cannot``) what these rows cannot test."""
        self.cannot = []
        self._bottleneck(say)
        self._region_and_runtime(say)
        self._caching(say)
        self._caveat(say)
        return self.cannot

    def _bottleneck(self, say: Say) -> None:
        say(f"1. The post: {post_quote('bottleneck')}.")
        for setting in self.settings:
            remote = self.at(self.first, setting).drop("local", errors="ignore")
            copies = self.at(self.again, setting)
            copies = copies[[m for m in copies.index if m in LOCAL_COPY]]
            if remote.empty or copies.empty:
                continue
            best, worst, copy = remote.idxmax(), remote.idxmin(), copies.median()
            r = copy / remote[best]
            lead, _ = _leader(remote)
            tied = [str(m) for m in remote.sort_values(ascending=False).index if LEAD * remote[m] > remote[best]]
            which = (f"the only first read measured ({best}" if len(remote) == 1 else f"the fastest first read ({best}" if lead
                     else f"the first reads of {listed(tied, 'and')}, within {LEAD}x of the highest ({best}")
            whose = [f"{m}'s" for m in copies.index]
            of = f", the median of {listed(whose, 'and')}" if len(copies) > 1 else ""
            as_in_2020 = ("the lab's link (its round trip and bandwidth) bounds first reads here: a link we chose, so a "
                          "mechanism, not a finding about the cloud." if setting[3].startswith("lab:") else "the transfer bounds first reads, as in 2020.")
            say(f"   - {_named(setting)}: {which}, {remote[best]:.1f} MB/s) ran "
                + (f"{r:.0f}x below re-reads of a local copy ({copy:.0f} MB/s{of}): {as_in_2020}"
                   if r >= 3 else f"only {r:.1f}x below re-reads of a local copy ({copy:.0f} MB/s{of}): the link was "
                   "hardly the limit here."))
            if len(remote) > 1:
                spread = remote[best] / remote[worst]
                say(f"     First reads spanned {spread:.1f}x across methods ({worst} {remote[worst]:.1f} MB/s to {best}): "
                    + ("how the transfer is done matters." if spread >= 2 else
                       f"the methods agreed within 2x; the post saw {post_quote('first_read')}."))

    def _region_and_runtime(self, say: Say) -> None:
        say(f"2. The post: {post_quote('region')}; for region it reported {post_quote('region_boost')}.")
        ratios = {}
        levels = ["lesson", "files", "size", "runtime", "method"]
        for key, per_region in self.first.groupby(level=levels):
            per_region = per_region.droplevel(levels)
            if len(per_region) < 2:
                continue
            known = {r: d for r in per_region.index if (d := self.distance(r)) is not None}
            if len(known) == len(per_region):  # lab profiles: nearest against farthest, as lesson 07 does
                near, far = min(known, key=known.__getitem__), max(known, key=known.__getitem__)
            else:  # real regions: no distance is known, so the fastest against the slowest
                near, far = per_region.idxmax(), per_region.idxmin()
            ratios[key] = (per_region[near] / per_region[far], near, far, len(known) == len(per_region))
        for (lesson, files, size, runtime, m), (r, near, far, both_known) in ratios.items():
            far_away = both_known and not 1 / 1.1 < r < 1.1
            say(f"   - {m} in {lesson}, {files} files ({size}), {runtime}: first read {r:.2f}x as fast in {near} as in {far}"
                + (f" ({'slower' if r > 1 else 'faster'} far away)." if far_away else "."))
        # A lab profile is an input we chose, so only ratios between two real regions are compared with the post.
        cloud = {k: v for k, v in ratios.items() if not (v[1].startswith("lab:") or v[2].startswith("lab:"))}
        if cloud:
            inside = sum(2 <= r <= 10 for r, *_ in cloud.values())
            say(f"     Between real regions, {inside} of {len(cloud)} comparisons fell within the post's range: " + (
                "it held for every way of reading measured." if inside == len(cloud) else
                "it held for none of them." if inside == 0 else "how much region matters depends on the way of reading."))
        if len(cloud) < len(ratios):
            say("     The comparisons between lab profiles measure how each way of reading responds to links we chose; "
                "how large the effect is between real regions is not something they can find.")
        if not cloud:
            self.cannot.append("the size of the region effect: no method was measured in two real regions by one lesson "
                               "with the same files")
        if not ratios:
            self.cannot.append("the effect of region: no method was measured in two regions by one lesson with the same "
                               f"files (regions present: {', '.join(self.regions)})")
        same_but_runtime = [k for k in SETTING if k != "runtime"]
        ep = self.ep
        by_runtime = ep[ep["kind"] == "first read"].groupby([*same_but_runtime, "method", "runtime"])["MBps"].median()
        pairs = by_runtime.groupby(level=[*same_but_runtime, "method"]).agg(["size", "max", "min"])
        pairs = pairs[pairs["size"] >= 2]
        for (lesson, files, size, region, m), p in pairs.iterrows():
            r = p["max"] / p["min"]
            say(f"   - {m} in {region}, {lesson}, {files} files ({size}): first reads {r:.2f}x apart across runtime kinds: "
                + ("runtime type made little difference, as the post found." if r < 1.5 else "runtime type mattered here."))
        if pairs.empty:
            self.cannot.append("the effect of runtime type: no method was measured by one lesson, with the same files in "
                               f"one region, on two runtime kinds (runtimes present: {', '.join(self.runtimes)})")

    def _caching(self, say: Say) -> None:
        say(f"3. The post: {post_quote('caching')}.")
        self._second_read(say)
        self._other_factors(say)

    def _other_factors(self, say: Say) -> None:
        """With the files local, did something other than reading bound training? Lesson 08's train rows say."""
        train = self.train
        if train is None or train.empty:
            self.cannot.append("whether other factors bound training once the files were local: no training-loop rows "
                               "(run lesson 08)")
            return
        later = train[(train["pass"] >= 2) & (train["error"].fillna("") == "")]
        if later.empty:
            self.cannot.append("whether other factors bound training once the files were local: no training-loop rows "
                               "after epoch 1")
        keys = [k for k in ("lesson", "region", "runtime", "compute_profile") if k in later.columns]
        for key, g in later.groupby(keys):
            best = g.groupby("method")["au"].median().sort_values(ascending=False)
            method, au = best.index[0], best.iloc[0]
            top = [m for m, v in best.items() if v >= au - AU_TIE]  # readers within a tie of the best
            bound = g[g["method"] == method]["bound_by"].mode().iloc[0]
            fetched = best.drop("local", errors="ignore")  # the readers that fetch; local disk is the reference
            if bound == "compute" and au >= AU_TARGET:
                verdict = ": reading was no longer the limit, as the post said."
            elif bound == "loader" and "local" in best.index and len(fetched) and \
                    best["local"] <= fetched.iloc[0] + AU_TIE:
                verdict = (f": local disk, with nothing to fetch, reached {best['local']:.0%}, no higher, so not the "
                           "network but the disk or the loader's own work (its workers, their CPUs) held training back; "
                           "these rows do not tell the two apart.")
            elif bound == "loader" and "local" in best.index:
                verdict = ": reading still held training back."
            elif bound == "loader":
                verdict = (": the loader held training back; with no local-disk reader beside it, these rows cannot say "
                           "whether reading or the loader's own work did.")
            else:
                verdict = ": these epochs cannot say whether reading was still the limit."
            runs = int(g.groupby("method").size().min())
            few = f" From {runs} run(s) of a reader here: too few to be sure." if runs < AU_MIN_RUNS else ""
            if len(top) == 1:
                busy = (f"best reader ({method}) kept the accelerator busy {percent(au, AU_TARGET)} of the time (whole "
                        "epochs), bound by")
            else:
                each = ", ".join(f"{m} {percent(best[m], AU_TARGET)}" for m in top)
                busy = (f"best readers ({each}; tied within {AU_TIE * 100:.0f} points) kept the accelerator busy up to "
                        f"{percent(au, AU_TARGET)} of the time (whole epochs), the best of them ({method}) bound by")
            say(f"   - {', '.join(map(str, key))}: after epoch 1 the {busy} {bound}{verdict}{few}")

    def _second_read(self, say: Say) -> None:
        say(f"   More specifically, the post found the second read {post_quote('second_read')}, while "
            f"{post_quote('gcsfuse')}.")
        below_1000 = False
        for setting in self.settings:
            f, a = self.at(self.first, setting), self.at(self.again, setting)
            copies = [m for m in a.index if m in LOCAL_COPY and m in f.index and m != "local"]
            if copies:
                best = max(copies, key=lambda m: a[m] / f[m])
                r = a[best] / f[best]
                below_1000 |= r < 1000
                say(f"   - {_named(setting)}: {best} re-read {r:.0f}x faster than its first read ({f[best]:.1f} -> "
                    f"{a[best]:.0f} MB/s)" + (": more than 1000x, as the post reported." if r >= 1000 else
                                               ", less than the post's 1000x."))
            if "gcsfuse" in f.index and "gcsfuse" in a.index:
                g = a["gcsfuse"] / f["gcsfuse"]
                say(f"     gcsfuse without its file cache re-read at {g:.2f}x its first read ({a['gcsfuse']:.1f} MB/s): "
                    + (f"about as slowly as the first time (under {GCSFUSE_AGAIN}x), as the post found." if g < GCSFUSE_AGAIN
                       else "faster than its first read, unlike in the post."))
            if "gcsfuse-cache" in f.index and "gcsfuse-cache" in a.index and (not copies or best != "gcsfuse-cache"):
                g = a["gcsfuse-cache"] / f["gcsfuse-cache"]
                say(f"     With its file cache, gcsfuse re-read {g:.1f}x faster than its first read "
                    "(the post did not have this option).")
        if below_1000:
            states = self.ep[self.ep["kind"] == "repeat"]["cache_state"].value_counts()
            say("     The course's re-reads were timed after dropping the files' pages from RAM; their rows say how that "
                "went (" + ", ".join(f"{n} {s}" for s, n in states.items()) + "). The post did not check that its second "
                "read had left the page cache.")
        if not any(m in set(self.ep["method"]) for m in ("gcsfuse", "gcsfuse-cache")):
            self.cannot.append("gcsfuse's re-reads: no gcsfuse rows in the pooled data")

    def _caveat(self, say: Say) -> None:
        ep, regions, lab_regions = self.ep, self.regions, self.lab_regions
        n_lab = int(ep["region"].str.startswith("lab:").sum())
        if n_lab:
            say(f"\nCaveat: {n_lab} of {len(ep)} epoch rows come from the offline lab ({', '.join(lab_regions)}). "
                "They show mechanisms under assumed links (toxiproxy on loopback, fake-gcs-server in memory) and are not "
                "cloud numbers." + (f" The other {len(ep) - n_lab} rows come from "
                                    f"{', '.join(r for r in regions if r not in lab_regions)}." if len(ep) > n_lab else ""))
        if not (set(ep["method"]) & {"drive", "folder"}):
            self.cannot.append("Google Drive, the post's main method: no Drive rows (Drive cannot run offline; run "
                               "lesson 01 in Colab)")
        if lab_regions == regions:
            self.cannot.append("any real cloud region or bucket: every row is from the lab; contribute Colab runs "
                               "(lesson 07)")
        say("\nWhat these runs cannot test:" if self.cannot else "\nEvery finding could be tested with these runs.")
        for c in self.cannot:
            say(f"   - {c}")

    def conclusion(self, say: Say = print) -> None:
        """The course's answer for these rows, from the same medians: where first reads were bound by the
        network, which way of reading paid them best (where one led by :data:`LEAD`), and what a local copy
        changed for every later epoch."""
        import pandas as pd

        bound, best_first, local_wins, gcsfuse_slow = [], {}, [], []
        for setting in self.settings:
            f, a = self.at(self.first, setting), self.at(self.again, setting)
            remote = f.drop("local", errors="ignore")
            copies = a[[m for m in a.index if m in LOCAL_COPY]]
            if remote.empty:
                continue
            lead = _leader(remote)[0]
            if lead:  # a fastest only where it led the next by LEAD (one way of reading names none)
                best_first[setting] = lead
            if not copies.empty:
                bound.append(copies.median() / remote.max() >= 3)
            if "gcsfuse" in a.index and not copies.empty:
                local_wins.append(copies.median() / a["gcsfuse"])
            if "gcsfuse" in f.index and "gcsfuse" in a.index:
                gcsfuse_slow.append(a["gcsfuse"] / f["gcsfuse"] < GCSFUSE_AGAIN)
        say(f"For the {_count(len(self.settings), 'setting')} pooled here (a setting is the files of one lesson, of one "
            "size, in one region, on one kind of runtime; "
            + (f"{len(self.lab_regions)} of {len(self.regions)} regions are lab profiles, not cloud regions):"
               if self.lab_regions else "none of them a lab profile):"))
        if bound:
            say(f"- First reads ran at least 3x below re-reads of a local copy in {sum(bound)} of {len(bound)} settings: "
                + ("first reads are paid to the network." if sum(bound) > len(bound) / 2 else
                   "in half of them the network was not the limit." if sum(bound) == len(bound) / 2 else
                   "in most, the network was not the limit."))
        if best_first:
            winners = pd.Series(list(best_first.values())).value_counts()
            say(f"- Of the {_count(len(best_first), 'setting')} where one way of reading led the next by {LEAD}x or more, the fastest "
                f"first read was {winners.index[0]} in {winners.iloc[0]}"
                + (f" (then {', '.join(f'{m} {n}' for m, n in winners.iloc[1:].items())})." if len(winners) > 1 else "."))
        if local_wins:
            span = (f"{min(local_wins):.1f}x" if f"{min(local_wins):.1f}" == f"{max(local_wins):.1f}" else
                    f"{min(local_wins):.1f}x to {max(local_wins):.1f}x")
            say(f"- A local copy (a cache or a copy on disk) re-read at {span} the speed of gcsfuse without a file "
                "cache, which "
                f"re-read about as slowly as it first read in {sum(gcsfuse_slow)} of {len(gcsfuse_slow)} settings"
                + (": after epoch 1, keep a local copy." if min(local_wins) >= 2 and all(gcsfuse_slow) else "."))
        say(f"- {len(self.cannot)} question(s) these runs cannot answer are listed with the findings above." if self.cannot
            else "- Every finding could be tested with these runs.")
