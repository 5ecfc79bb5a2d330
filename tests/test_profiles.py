"""Region profiles shape real traffic through toxiproxy, and switch without restarts.

These check that the lab's shaping works (the lab is a measuring instrument); they are not
benchmarks of dataferry. Ranges are the ones the lab promises.
"""

import statistics
import time

import pytest

from dataferry.course.lab import PROFILES, LabError, Profile, get_profile

MB = 1_000_000


def _download_rate(lab, bucket, name):
    blob = lab.client().bucket(bucket).blob(name)
    t0 = time.perf_counter()
    n = len(blob.download_as_bytes())
    return n / (time.perf_counter() - t0) / MB


def _small_request_s(lab, bucket, name, n=5, stat=statistics.median):
    client = lab.client()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.bucket(bucket).blob(name).download_as_bytes()
        times.append(time.perf_counter() - t0)
    return stat(times)


@pytest.fixture
def objects(lab, lab_bucket):
    lab_bucket.blob("big.bin").upload_from_string(bytes(20 * MB))
    lab_bucket.blob("small.bin").upload_from_string(b"x" * 100)
    return lab_bucket.name


def test_bandwidth_profile_gives_its_rate_and_switching_changes_it(lab, objects):
    pids = {n: p["pid"] for n, p in lab.status()["processes"].items()}
    lab.set_profile(Profile("test-20", 0, 20))
    assert 14 <= _download_rate(lab, objects, "big.bin") <= 22
    lab.set_profile(Profile("test-40", 0, 40))
    assert 28 <= _download_rate(lab, objects, "big.bin") <= 44
    assert {n: p["pid"] for n, p in lab.status()["processes"].items()} == pids, "nothing restarted"


def test_cross_continent_profile_is_20_MBps(lab, objects):
    lab.set_profile("cross-continent")
    assert 14 <= _download_rate(lab, objects, "big.bin") <= 22


def test_latency_profile_adds_at_least_its_latency_and_switching_changes_it(lab, objects):
    # The unshaped request's fastest time: a median's noise once came to more than the slack
    # between a shaped median and base + latency (43.3 ms against 3.6 + 40).
    base = _small_request_s(lab, objects, "small.bin", stat=min)
    lab.set_profile(Profile("test-150ms", 150, None))
    slow = _small_request_s(lab, objects, "small.bin")
    assert slow - base >= 0.150
    lab.set_profile(Profile("test-40ms", 40, None))
    faster = _small_request_s(lab, objects, "small.bin")
    assert faster - base >= 0.040
    assert faster < slow - 0.080
    lab.set_profile("unshaped")
    assert _small_request_s(lab, objects, "small.bin") < base + 0.030


def test_using_profile_restores_the_previous_one(lab, objects):
    lab.set_profile("same-continent")
    with lab.using_profile("cross-continent") as p:
        assert lab.profile.name == "cross-continent" == p.name
    assert lab.profile.name == "same-continent"


def test_profiles_are_documented_assumptions():
    assert {"unshaped", "colocated", "same-continent", "cross-continent"} <= set(PROFILES)
    for p in PROFILES.values():
        assert p.assumption, f"{p.name} must say where its numbers come from"
        assert p.label == f"lab:{p.name}"
    rtts = [PROFILES[n].rtt_ms for n in ("colocated", "same-continent", "cross-continent")]
    assert rtts == sorted(rtts) and len(set(rtts)) == 3


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(LabError, match="unknown region profile 'mars'.*cross-continent"):
        get_profile("mars")


def test_only_a_lab_region_has_a_known_distance():
    from dataferry.course.lab.profiles import added_rtt_ms

    assert added_rtt_ms("lab:colocated") < added_rtt_ms("lab:cross-continent")
    assert added_rtt_ms("lab:cross-continent") == PROFILES["cross-continent"].rtt_ms
    assert added_rtt_ms("us-central1") is None and added_rtt_ms("lab:no-such-profile") is None
