"""The training-loop emulator: accelerator utilisation from real DataLoader workers and a compute step."""

import time

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from dataferry.harness.feed import PROFILES, ComputeProfile, EmulatedCompute, feed, image_sample  # noqa: E402


class SlowSamples(Dataset):
    """Each sample costs ``delay_s`` of a worker's time (a stand-in for a read that waits on the network)."""

    def __init__(self, n: int, delay_s: float) -> None:
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay_s)
        return i


def steady_au(report) -> float:
    """AU once the pipeline is full: after the first step and the batches the workers fetched ahead."""
    fill = report.fill_steps
    assert fill == 1 + 2 * 2, "two workers fetch two batches each ahead of the first step"
    assert report.steady_au == pytest.approx(sum(report.busy_s[fill:]) / (report.wall_s - report.fill_s))
    return report.steady_au


@pytest.mark.parametrize("compute_s, expected", [(0.02, 0.5), (0.08, 1.0)], ids=["loader-bound", "compute-bound"])
def test_au_is_compute_over_the_slower_of_loader_and_compute_with_worker_processes(compute_s, expected):
    batch, per_sample, workers = 4, 0.02, 2
    loader_s = batch * per_sample / workers  # two workers each make a batch in 0.08 s: one every 0.04 s
    ds = SlowSamples(batch * 30, per_sample)
    loader = DataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=True)
    profile = ComputeProfile("test", "none", "sleep", batch / compute_s, batch, "this test")
    (first, second) = feed(loader, EmulatedCompute(profile), epochs=2)
    assert compute_s / max(compute_s, loader_s) == expected
    for report in (first, second):
        assert report.steps == 30 and report.samples == batch * 30
        assert report.compute_s == pytest.approx(30 * compute_s, rel=0.1)
        assert steady_au(report) == pytest.approx(expected, abs=0.08)
        assert report.au <= steady_au(report) + 1e-9
        # every wait counts, the first (starting the workers) too: that is the definition, on a loaded machine too
        assert report.bound_by == ("loader" if report.wait_s > 0.1 * report.wall_s else "compute")
    # epoch 2's persistent workers start nothing: what bounds it is the slower side
    assert second.bound_by == ("loader" if expected < 1 else "compute")


def test_a_loader_that_yields_everything_at_once_gives_full_utilisation_and_no_loader_bound_steps():
    batches = [torch.zeros(8, 3) for _ in range(10)]
    (report,) = feed(batches, ComputeProfile("t", "none", "sleep", 800, 8, "this test"))
    assert report.au > 0.9 and report.loader_bound == 0 and report.bound_by == "compute"
    assert report.samples == 80 and report.samples_per_s == pytest.approx(80 / report.wall_s)
    row = report.to_dict()
    assert row["wait_p95_s"] >= row["wait_p50_s"] >= 0 and row["bound_by"] == "compute"


def test_before_epoch_runs_outside_the_clock():
    (report,) = feed([torch.zeros(1)], ComputeProfile("t", "none", "sleep", 1000, 1, "t"),
                     before_epoch=lambda epoch: time.sleep(0.3))
    assert report.wall_s < 0.1


def test_every_profile_names_its_source_and_the_rate_it_needs():
    for name, p in PROFILES.items():
        assert p.name == name and p.samples_per_s > 0 and p.source
        assert p.needs_MBps(110_000) == pytest.approx(p.samples_per_s * 0.11)
    assert "DeepLearningExamples" in PROFILES["resnet50-a100-amp"].source


def test_image_sample_fills_the_model_input_from_any_bytes():
    x, y = image_sample(b"\x07abc", shape=(3, 4, 4), classes=5)
    assert x.shape == (3, 4, 4) and x.dtype == torch.uint8 and y == 7 % 5
    assert bytes(x.flatten()[:8].tolist()) == b"\x07abc\x07abc"


def test_a_loader_that_delivers_in_bursts_is_the_bound_though_most_steps_do_not_wait():
    batch = torch.zeros(4)

    def bursts():
        for i in range(16):
            if i % 4 == 0:
                time.sleep(0.1)  # four workers finishing together: one long wait, then three batches at once
            yield batch

    (report,) = feed(bursts(), ComputeProfile("t", "none", "sleep", 1000, 4, "t"))
    assert report.loader_bound <= 4 < report.steps // 2
    assert report.au < 0.25 and report.bound_by == "loader"


class SlowToDevice(torch.Tensor):
    """A batch on a busy host: moving it to the device costs ``STALL_S`` of host time inside the step (a
    pageable copy, or kernels launched late by a host thread that competes for the CPU)."""

    STALL_S = 0.0

    def to(self, *args, **kwargs):  # type: ignore[override]
        time.sleep(SlowToDevice.STALL_S)
        return torch.Tensor.to(self.as_subclass(torch.Tensor), *args, **kwargs)


def test_au_of_a_real_model_does_not_count_a_slow_host_as_compute(monkeypatch):
    """AU is the compute the epoch's samples need at the model's compute-only rate, over wall time (MLPerf
    Storage's definition). With a host stall three times the compute inside every step, the answer is 25%
    (20-29% even if the measured rate were off by 2x either way); timing each step (what CUDA events around a
    step measure) says nearly 100%."""
    from dataferry.harness.feed import TorchCompute

    torch.manual_seed(0)
    monkeypatch.setattr(SlowToDevice, "STALL_S", 0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        compute = TorchCompute("smallcnn", device="cpu", amp=False)
        rate = compute.warm_up((16, 3, 64, 64), steps=3, measure=20)
        step_s = 16 / rate
        monkeypatch.setattr(SlowToDevice, "STALL_S", 3 * step_s)
        batches = [(torch.randint(0, 256, (16, 3, 64, 64), dtype=torch.uint8).as_subclass(SlowToDevice),
                    torch.zeros(16, dtype=torch.long)) for _ in range(10)]
        bracketed = []
        timed_step = compute.step

        def step(batch):
            t0 = time.perf_counter()
            timed_step(batch)
            bracketed.append(time.perf_counter() - t0)

        compute.step = step
        (report,) = feed(batches, compute)
    finally:
        torch.set_num_threads(threads)
    assert report.compute_s == pytest.approx(10 * step_s)
    assert report.au == pytest.approx(0.25, abs=0.1), report
    assert sum(bracketed) / report.wall_s > 0.9, "timing the steps counts the stall as compute"


def test_an_epoch_of_one_step_is_bound_by_its_wait_and_has_no_steady_state():
    """Every wait counts in ``bound_by``, the first step's (which starts the workers) too: a short epoch is
    bound by the loader however fast its later steps. (It used to leave the first wait out, and said
    "compute" at 8% AU.) The steady state, after the first step, is reported apart; one step has none."""
    (report,) = feed(DataLoader(SlowSamples(4, 0.05), batch_size=4, num_workers=1),
                     ComputeProfile("t", "none", "sleep", 4000, 4, "this test"))
    assert report.steps == 1 and report.au < 0.1
    assert report.bound_by == "loader" and report.to_dict()["bound_by"] == "loader"
    assert report.steady_au != report.steady_au, "NaN: one step has no steady state"


def test_a_long_first_wait_makes_a_short_epoch_loader_bound_though_its_steady_state_is_not():
    """Four steps of fast compute after a slow start: the steady state kept the accelerator busy, the epoch did
    not. ``bound_by`` says what the epoch saw; ``steady_au`` what a long run would."""
    from dataferry.harness.feed import EpochReport

    report = EpochReport(1, "emulated", 4, 128, wall_s=1.0, compute_s=0.36, loader_bound=1,
                         waits_s=[0.6, 0.01, 0.01, 0.01], fill_steps=1, busy_s=[0.09] * 4)
    assert report.au == pytest.approx(0.36) and report.bound_by == "loader"
    assert report.steady_au == pytest.approx(0.27 / 0.31) and report.to_dict()["steady_au"] == report.steady_au
    prefetched = EpochReport(1, "emulated", 4, 128, 1.0, 0.36, 1, [0.6, 0.01, 0.01, 0.01], fill_steps=9)
    assert prefetched.steady_au != prefetched.steady_au, "four workers fetched every batch ahead: no steady state"


def test_the_emulated_accelerator_is_busy_for_the_compute_it_emulates_not_the_sleeps_overshoot():
    """Steps of 0.45 ms (16 samples at 35,000/s): a sleep overshoots by a good share of that, and counting the
    overshoot as compute read AU 9% where samples/s gave 7.6%."""
    profile = ComputeProfile("fast", "none", "sleep", 35_000, 16, "this test")
    compute = EmulatedCompute(profile)
    compute.begin_epoch()
    for _ in range(20):
        compute.step(torch.zeros(16, 3))
    assert compute.end_epoch() == [profile.step_s(16)] * 20
