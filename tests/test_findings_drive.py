"""Lesson 01's findings (dataferry.course.findings.drive), each sentence on both sides of its threshold."""

from __future__ import annotations

import pandas as pd
import pytest

from dataferry.course.findings import drive

WHERE = "lab:same-continent; a stand-in for Drive, not Drive"


def _listed(scandir_ms, listdir_ms, n=2000, on_drive=False):
    rows = []
    for i, (fast, slow) in enumerate(zip(scandir_ms, listdir_ms)):
        for way, ms in (("os.scandir", fast), ("os.listdir + os.stat", slow)):
            rows += [{"method": way, "pass": 2 if on_drive else 1, "ms": ms, "repeat": i, "file": f"({n} entries)"}]
            if not on_drive:
                rows.append({"method": way, "pass": 2, "ms": ms / 2, "repeat": i, "file": f"({n} entries)"})
    if on_drive:
        rows.insert(0, {"method": "os.scandir", "pass": 1, "ms": 900.0, "repeat": 0, "file": f"({n} entries)"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("factor, words", [(1.15, "the stat per file cost about"),
                                           (1.05, "the two ways cost about the same"),
                                           (1.10, "the interval straddles 1.1x")])
def test_the_stat_per_file_is_said_to_cost_from_one_and_a_tenth(factor, words):
    fast = [100.0, 101.0, 99.0, 100.5, 99.5]
    said = drive.listing(_listed(fast, [f * factor for f in fast]), WHERE, False, 5)
    assert words in said.sentences[0] and "first listings on a fresh mount of 2000 files" in said.sentences[0]
    assert ("an extrapolation, not a measurement" in said.sentences[0]) is (factor > drive.STAT_COSTS)
    assert said.sentences[1].startswith("Listing again on the same mount took")
    assert str(said).startswith(f"In this run ({WHERE}):")


def test_on_drive_the_ways_are_compared_on_listings_again_and_few_repeats_are_said():
    said = drive.listing(_listed([100.0, 100.0], [300.0, 300.0], on_drive=True), "Google Drive, region x", True, 2)
    assert "listings again on Drive" in said.sentences[0] and "no interval, so this run cannot tell" in said.sentences[0]
    assert said.sentences[1] == ("The first listing of this run took 900 ms. Drive cannot be made cold from inside a "
                                 "runtime, so the ways were compared on listings again.")
    assert said.sentences[-1].startswith("Only 2 repetition(s)")


def _reads(first, again, method="gcsfuse-cache", passes=2, state="daemon_warm"):
    rows = []
    for i, (f, a) in enumerate(zip(first, again)):
        rows.append({"phase": "epoch", "method": method, "pass": 1, "MBps": f, "error": "", "repeat": i,
                     "cache_state": "cold_unverified"})
        rows += [{"phase": "epoch", "method": method, "pass": 2, "MBps": a, "error": "", "repeat": i + p,
                  "cache_state": state} for p in range(2, passes + 1)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("factor, local", [(2.2, True), (1.8, False)])
def test_a_re_read_is_said_local_from_twice_the_first_reads_speed(factor, local):
    first = [10.0, 10.2, 9.8, 10.1, 9.9]
    said = drive.first_vs_repeat(_reads(first, [f * factor for f in first]), WHERE, False, True, 5)
    assert ("gcsfuse's file cache on the runtime" in said.sentences[0]) is local
    assert ("every epoch crosses the network again" in said.sentences[0]) is not local
    assert "this stand-in does not model" in said.sentences[1], "the post's 1000x is Drive's, not the stand-in's"


def test_drive_says_its_one_first_read_and_the_posts_1000x_with_the_eviction_checked_or_not():
    said = drive.first_vs_repeat(_reads([10.0], [500.0], method="drive", passes=6), "Google Drive, region x", True,
                                 True, 5)
    assert "Drive's daemon kept the files on the runtime itself (the page cache was evicted, and checked)" in said.sentences[0]
    assert "one first read" in said.sentences[1]
    assert said.sentences[-1].endswith("evicted and checked, it was 50x here.") and "without checking" in said.sentences[-1]
    unchecked = drive.first_vs_repeat(_reads([10.0], [25.0], method="drive", passes=6, state="cold_unverified"),
                                      "Google Drive", True, True, 5)
    assert "could not be checked empty" in unchecked.sentences[0]
    assert unchecked.sentences[-1].endswith("with the page cache evicted, it was 2.5x here.")


def test_a_first_read_this_runtime_touched_before_is_not_judged():
    said = drive.first_vs_repeat(_reads([10.0], [11.0], method="drive", passes=6), "Google Drive", True, False, 5)
    assert said.sentences == [
        "The first read ran at a median 10.0 MB/s per epoch and the re-read at 11 MB/s. This runtime wrote or read "
        "these files before the first read, so both may have come from what Drive keeps on the runtime: this run "
        "cannot say what a first read from Drive costs.",
        "For a true first read: Runtime > Disconnect and delete runtime, then run this lesson again (the sample "
        "stays on your Drive)."]


def test_no_first_and_repeat_pair_is_said_as_such():
    rows = _reads([10.0], [20.0]).assign(error="OSError: gone")
    assert drive.first_vs_repeat(rows, WHERE, False, True, 5).sentences == [
        "No usable first/repeat pair was measured: see the error rows above."]


def _archives(zip_s, files_s, stage_s=None):
    rows = [{"way": "zip: copy + extract", "seconds": s, "extract_s": s / 10, "local_bytes": 30e6} for s in zip_s]
    rows += [{"way": "tar: copy + extract", "seconds": s * 1.1, "extract_s": s / 10, "local_bytes": 31e6} for s in zip_s]
    rows += [{"way": "files through the mount", "seconds": s} for s in files_s]
    rows += [{"way": "dataferry stage", "seconds": s} for s in stage_s or []]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("files_factor, words", [(1.3, "the archive was faster."),
                                                 (0.7, "the files through the mount were faster."),
                                                 (1.0, "the interval straddles 1x")])
def test_the_archive_against_the_files_on_each_side_of_even(files_factor, words):
    zipped = [0.50, 0.51, 0.49, 0.52, 0.48]
    said = drive.archive(_archives(zipped, [z * files_factor for z in zipped]), WHERE, False, None, 5)
    assert said.sentences[0] == ("Copying the zip to local disk, extracting and reading it took a median 0.50 s; "
                                 "extracting was 10% of it, and the disk held the archive and its files at once, "
                                 "30.0 MB at the peak.")
    assert words in said.sentences[1]
    assert said.sentences[-1].startswith("The archive has to be uploaded again")


@pytest.mark.parametrize("stage_factor, words", [(0.7, "staging was faster, and keeps every file verified."),
                                                 (1.3, "the archive was faster.")])
def test_staging_against_the_archive_and_the_labs_cap_are_said(stage_factor, words):
    zipped = [0.50, 0.51, 0.49, 0.52, 0.48]
    said = drive.archive(_archives(zipped, zipped, [z * stage_factor for z in zipped]), WHERE, False, 50.0, 5)
    assert said.sentences[2].startswith("Staging the files from the bucket with dataferry took") and words in said.sentences[2]
    assert "capped at 50 MB/s, a profile input" in said.sentences[3]


def test_no_archive_says_why_and_drive_says_only_a_first_repetition_is_a_first_read():
    assert drive.archive(pd.DataFrame(), "region x", False, None, 5, "a public bucket cannot take one").sentences == [
        "a public bucket cannot take one"]
    said = drive.archive(_archives([0.5] * 5, [0.5] * 5), "Google Drive", True, None, 5)
    assert any(s.startswith("On Drive this comparison favours the files: section 3 read them already") for s in said)
