"""Will my GPU starve? A training loop that measures accelerator utilisation (AU).

AU is the share of an epoch's wall time the accelerator spends computing, as MLPerf Storage
defines it (>= 90% passes). :func:`feed` drives real epochs of any loader (a PyTorch
``DataLoader`` with real workers over any of the course's data paths) into a compute step:

- :class:`EmulatedCompute` sleeps for a :class:`ComputeProfile`'s time per batch, as MLPerf's
  DLIO does, so the question is answered on any machine, GPU or not;
- :class:`TorchCompute` trains a real model on a CUDA device (or the CPU) and counts its compute at
  the model's compute-only rate, measured with data already on the device (MLPerf Storage's way).

Each epoch gives an :class:`EpochReport`: AU, samples/s, the data wait per step (its
distribution) and how many steps the loader, not the compute, bound. Profiles say where their
figure comes from; :func:`measure_profile` makes one on the GPU at hand.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from dataferry.errors import BadArgument

__all__ = ["ComputeProfile", "PROFILES", "EmulatedCompute", "TorchCompute", "EpochReport", "feed", "measure_profile", "sample_ms",
           "image_sample", "small_cnn"]

#: A step is bound by the loader when the compute waited longer than this share of its own time for the batch.
LOADER_BOUND_SHARE = 0.05
#: MLPerf Storage's pass: the accelerator busy at least this share of the time.
PASS_AU = 0.9


@dataclass(frozen=True)
class ComputeProfile:
    """How fast an accelerator trains a model: ``samples_per_s`` at ``batch_size``, and where that figure is from."""

    name: str
    model: str
    accelerator: str
    samples_per_s: float
    batch_size: int
    source: str

    def step_s(self, samples: int) -> float:
        """Seconds of accelerator work for a batch of ``samples``."""
        return samples / self.samples_per_s

    def needs_MBps(self, sample_bytes: float) -> float:
        """The data rate (10^6 bytes/s) that keeps this accelerator busy with samples of ``sample_bytes``."""
        return self.samples_per_s * sample_bytes / 1e6

    def __repr__(self) -> str:
        return f"<ComputeProfile {self.name}: {self.samples_per_s:g} samples/s ({self.model} on {self.accelerator})>"


_DLE = ("NVIDIA DeepLearningExamples, ResNet50 v1.5 for PyTorch, README 'Training performance: {}', 1 GPU row, "
        "pytorch-21.03 NGC container; batch size per GPU from ConvNets/configs.yml: https://github.com/NVIDIA/"
        "DeepLearningExamples/tree/master/PyTorch/Classification/ConvNets/resnet50v1.5")
_H100 = ("measured by dataferry.harness.feed.measure_profile on an NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, "
         "torchvision 0.26.0) on 2026-11-23 with scripts/gpu_feed.py: batch 256, float16 autocast, channels_last, "
         "30 steps after 10 warm-up, CUDA events; the median of three runs (ResNet-50: 4640, 4667, 4768; "
         "the small CNN: 35240, 35359, 41890)")

#: Published or measured training rates. T4 and L4 have no published figure here: measure yours with
#: :func:`measure_profile` on the runtime (lesson 08 does, when it finds a GPU).
PROFILES: dict[str, ComputeProfile] = {p.name: p for p in (
    ComputeProfile("resnet50-v100-fp32", "ResNet-50 v1.5, FP32", "V100 16GB", 367, 112,
                   _DLE.format("NVIDIA DGX-1 16GB (8x V100 16GB)")),
    ComputeProfile("resnet50-v100-amp", "ResNet-50 v1.5, mixed precision", "V100 16GB", 1200, 256,
                   _DLE.format("NVIDIA DGX-1 16GB (8x V100 16GB)")),
    ComputeProfile("resnet50-a100-amp", "ResNet-50 v1.5, mixed precision", "A100 80GB", 2470, 256,
                   _DLE.format("NVIDIA DGX A100 (8x A100 80GB)")),
    ComputeProfile("resnet50-a100-tf32", "ResNet-50 v1.5, TF32", "A100 80GB", 938, 256,
                   _DLE.format("NVIDIA DGX A100 (8x A100 80GB)")),
    ComputeProfile("resnet50-h100-amp", "ResNet-50 (torchvision), mixed precision", "H100 80GB", 4667, 256, _H100),
    ComputeProfile("smallcnn-h100-amp", "a 4-layer CNN on 3x64x64 inputs (small_cnn), mixed precision", "H100 80GB",
                   35359, 256, _H100),
)}


@dataclass
class EpochReport:
    """One epoch through the loop. ``au`` = compute_s / wall_s; ``waits_s`` is the data wait of each step
    (the first includes starting the loader's workers); ``loader_bound`` counts the steps whose wait
    exceeded :data:`LOADER_BOUND_SHARE` of their compute."""

    epoch: int
    mode: str
    steps: int
    samples: int
    wall_s: float
    compute_s: float
    loader_bound: int
    waits_s: list[float] = field(repr=False)
    fill_steps: int = 1
    busy_s: list[float] = field(default_factory=list, repr=False)

    @property
    def au(self) -> float:
        return self.compute_s / self.wall_s if self.wall_s else float("nan")

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s else float("nan")

    @property
    def wait_s(self) -> float:
        return sum(self.waits_s)

    def wait_quantile(self, q: float) -> float:
        """The ``q`` quantile of the per-step data wait, in seconds (NaN without steps)."""
        if not self.waits_s:
            return float("nan")
        if len(self.waits_s) == 1:
            return self.waits_s[0]
        return statistics.quantiles(self.waits_s, n=100, method="inclusive")[max(0, min(98, round(q * 100) - 1))]

    @property
    def fill_s(self) -> float:
        """The time of the first ``fill_steps`` steps: the workers starting and the batches they fetch ahead
        (``num_workers x prefetch_factor``) consumed; the pipeline is full only after them."""
        busy = self.busy_s or [self.compute_s / self.steps] * self.steps if self.steps else []
        return sum(self.waits_s[:self.fill_steps]) + sum(busy[:self.fill_steps])

    @property
    def steady_au(self) -> float:
        """AU after the pipeline's fill (:attr:`fill_s`): the steady state a long run sees, reported apart from
        :attr:`au`; NaN for an epoch no longer than its fill, which has none (its batches were all fetched
        ahead, so the steps after the first barely wait whatever the source)."""
        if self.steps <= self.fill_steps:
            return float("nan")
        busy = self.busy_s or [self.compute_s / self.steps] * self.steps
        rest = self.wall_s - self.fill_s
        return sum(busy[self.fill_steps:]) / rest if rest > 0 else float("nan")

    @property
    def bound_by(self) -> str:
        """``loader`` when the accelerator waited for data more than ``1 - PASS_AU`` of the epoch, every wait
        counted (the first step's too: in a short epoch, starting the workers is what bounds it); else
        ``compute``. Time, not a count of steps: workers that finish together make one long wait and several
        short ones."""
        return "loader" if self.wait_s > (1 - PASS_AU) * self.wall_s else "compute"

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "waits_s"}
        return {**d, "au": self.au, "samples_per_s": self.samples_per_s, "wait_s": self.wait_s,
                "wait_p50_s": self.wait_quantile(0.5), "wait_p95_s": self.wait_quantile(0.95),
                "first_wait_s": self.waits_s[0] if self.waits_s else float("nan"), "fill_s": self.fill_s,
                "steady_au": self.steady_au,
                "bound_by": self.bound_by}

    def __repr__(self) -> str:
        return (f"<EpochReport {self.epoch} ({self.mode}): AU {self.au:.1%}, {self.samples_per_s:.0f} samples/s, "
                f"{self.steps} steps, {self.loader_bound} loader-bound>")


def _batch_len(batch: Any) -> int:
    """Samples in a collated batch: a tensor, a list of samples, a (inputs, labels) pair or a dict of columns."""
    if hasattr(batch, "shape"):
        return int(batch.shape[0])
    if isinstance(batch, dict):
        return _batch_len(next(iter(batch.values())))
    if isinstance(batch, (tuple, list)) and batch and (hasattr(batch[0], "shape") or isinstance(batch[0], (list, tuple))):
        return _batch_len(batch[0])
    return len(batch)


class EmulatedCompute:
    """An accelerator that sleeps for ``profile.step_s(samples)`` per batch (MLPerf Storage's DLIO does the same),
    busy for exactly that long: AU then agrees with the samples per second over the profile's rate."""

    mode = "emulated"

    def __init__(self, profile: ComputeProfile) -> None:
        self.profile = profile

    def begin_epoch(self) -> None:
        self._busy: list[float] = []

    def step(self, batch: Any) -> None:
        t = self.profile.step_s(_batch_len(batch))
        time.sleep(t)
        self._busy.append(t)  # the compute it emulates: a sleep's overshoot is the host's, not the accelerator's

    def end_epoch(self) -> list[float]:
        """Each step's compute seconds."""
        return self._busy

    def __repr__(self) -> str:
        return f"<EmulatedCompute {self.profile.name}>"


class TorchCompute:
    """Trains a real model on a torch ``device`` (``"cuda"``; ``"cpu"`` works too): each batch is moved to the
    device, then forward, backward and an SGD step. ``model`` is a torchvision classification model's name
    (random weights, nothing downloaded), ``"smallcnn"`` (:func:`small_cnn`) or an ``nn.Module``; batches are
    ``(inputs, labels)``, uint8 inputs scaled to [0, 1] on the device. ``amp``: float16 autocast with a grad
    scaler (CUDA only).

    The compute an epoch needs is counted as MLPerf Storage counts it: its samples at the model's
    compute-only rate, which :meth:`warm_up` measures with a batch already on the device. Timing the steps
    themselves (CUDA events around each) would count the device as busy while it waits for a slow host
    thread (a pageable copy, kernels launched late), and read high: 90% where throughput gave 80%."""

    def __init__(self, model: Any = "resnet50", *, device: str = "cuda", amp: bool = True,
                 channels_last: bool = True) -> None:
        import torch

        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BadArgument("TorchCompute on 'cuda' needs a CUDA device and torch.cuda.is_available() is False "
                              "here: use EmulatedCompute(profile), or device='cpu'")
        if model == "smallcnn":
            model = small_cnn()
        elif isinstance(model, str):
            import torchvision

            model = torchvision.models.get_model(model, weights=None)
        self.torch, self.device = torch, torch.device(device)
        self.mode = self.device.type
        self.amp = amp and self.mode == "cuda"
        self.channels_last = channels_last
        self.scaler = torch.amp.GradScaler(self.mode, enabled=self.amp)
        self.name = type(model).__name__
        self.model = model.to(self.device, memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = torch.nn.CrossEntropyLoss()
        self.samples_per_s: float | None = None  # the compute-only rate, once warm_up has measured it

    def warm_up(self, inputs_shape: tuple[int, ...], steps: int = 3, measure: int = 10) -> float:
        """Run ``steps`` steps on random uint8 inputs of ``inputs_shape`` (batch first), outside any clock (CUDA
        context, cuDNN's algorithm search and the allocator's first growth are not epoch 1's cost), then time
        ``measure`` more with that batch already on the device: the compute-only rate in samples/s, kept in
        :attr:`samples_per_s` and returned."""
        torch = self.torch
        x = torch.randint(0, 256, inputs_shape, dtype=torch.uint8, device=self.device)
        y = torch.zeros(inputs_shape[0], dtype=torch.long, device=self.device)
        for _ in range(steps):
            self._train_step(x, y)
        self._synchronize()
        t0 = time.perf_counter()
        for _ in range(measure):
            self._train_step(x, y)
        self._synchronize()
        self.samples_per_s = inputs_shape[0] * measure / (time.perf_counter() - t0)
        return self.samples_per_s

    def begin_epoch(self) -> None:
        if self.samples_per_s is None:
            raise RuntimeError("call warm_up(inputs_shape) first: AU needs the model's compute-only rate")
        self._samples: list[int] = []

    def step(self, batch: Any) -> None:
        x, y = batch
        self._samples.append(int(x.shape[0]))
        self._train_step(x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))

    def _train_step(self, x: Any, y: Any) -> None:
        torch = self.torch
        x = (x.float() / 255) if x.dtype == torch.uint8 else x
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.mode, dtype=torch.float16, enabled=self.amp):
            loss = self.loss(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def _synchronize(self) -> None:
        if self.mode == "cuda":
            self.torch.cuda.synchronize(self.device)

    def end_epoch(self) -> list[float]:
        """Waits for the device; then each step's compute at the compute-only rate (seconds)."""
        self._synchronize()
        assert self.samples_per_s is not None
        return [n / self.samples_per_s for n in self._samples]

    def __repr__(self) -> str:
        where = self.torch.cuda.get_device_name(self.device) if self.mode == "cuda" else self.mode
        rate = f", {self.samples_per_s:,.0f} samples/s compute-only" if self.samples_per_s else ""
        return f"<TorchCompute {self.name} on {where}{rate}>"


#: The batches each DataLoader worker fetches ahead unless told otherwise (``prefetch_factor``, PyTorch's).
PREFETCH_FACTOR = 2


def fill_steps(loader: Any) -> int:
    """Steps until a loader's pipeline is full: the first, which starts the workers, and the batches they
    fetch ahead of it (``num_workers x prefetch_factor``; 1 for a loader without workers)."""
    inner = loader if hasattr(loader, "num_workers") else getattr(loader, "loader", loader)  # a wrapper's own
    workers = getattr(inner, "num_workers", 0) or 0
    return 1 + workers * (getattr(inner, "prefetch_factor", None) or PREFETCH_FACTOR) if workers else 1


def feed(loader: Iterable[Any], compute: EmulatedCompute | TorchCompute | ComputeProfile, epochs: int = 1,
         before_epoch: Callable[[int], Any] | None = None,
         on_epoch: Callable[[EpochReport], Any] | None = None) -> list[EpochReport]:
    """Run ``epochs`` epochs of ``loader`` into ``compute`` and report each.

    An epoch's clock starts before ``iter(loader)`` (starting workers is data wait too) and stops
    after the last step's compute has finished. ``before_epoch(epoch)`` runs outside the clock
    (e.g. to drop the page cache); ``on_epoch(report)`` gets each report as it is made."""
    if isinstance(compute, ComputeProfile):
        compute = EmulatedCompute(compute)
    reports = []
    for epoch in range(1, epochs + 1):
        if before_epoch is not None:
            before_epoch(epoch)
        compute.begin_epoch()
        waits, samples = [], 0
        t0 = time.perf_counter()
        it = iter(loader)  # starts the workers: part of the first step's wait
        w0 = t0
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            waits.append(time.perf_counter() - w0)
            samples += _batch_len(batch)
            compute.step(batch)
            w0 = time.perf_counter()
        busy = compute.end_epoch()
        wall = time.perf_counter() - t0
        # The wait before step i overlaps step i-1's compute on a GPU (it runs asynchronously), not in a sleep.
        ahead = [0.0] + busy[:-1] if compute.mode == "cuda" else [0.0] * len(busy)
        bound = sum(w - a > LOADER_BOUND_SHARE * b for w, a, b in zip(waits, ahead, busy))
        report = EpochReport(epoch, compute.mode, len(waits), samples, wall, sum(busy), bound, waits,
                             fill_steps(loader), list(busy))
        reports.append(report)
        if on_epoch is not None:
            on_epoch(report)
    return reports


def sample_ms(dataset: Any, n: int = 64, seed: int = 0) -> float:
    """Milliseconds to prepare one sample on this core: ``dataset[i]`` (read, check, decode, augment) for
    ``n`` random indices, after one untimed read of each (so a cache is warm). What each DataLoader worker
    pays per sample: ``workers`` of them give at most ``workers * 1000 / sample_ms`` samples/s."""
    import random

    picks = random.Random(seed).sample(range(len(dataset)), min(n, len(dataset)))
    for i in picks:
        dataset[i]
    t0 = time.perf_counter()
    for i in picks:
        dataset[i]
    return (time.perf_counter() - t0) / len(picks) * 1e3


def small_cnn(classes: int = 1000) -> Any:
    """A 4-layer CNN for 3x64x64 inputs: a model fast enough that data loading, not compute, bounds it."""
    from torch import nn

    def block(c_in: int, c_out: int) -> list[Any]:
        return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                nn.MaxPool2d(2)]

    return nn.Sequential(*block(3, 32), *block(32, 64), *block(64, 128), *block(128, 256),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, classes))


def image_sample(data: bytes, shape: tuple[int, ...] = (3, 224, 224), classes: int = 1000) -> tuple[Any, int]:
    """Bytes of one sample -> (a uint8 tensor of ``shape``, the bytes tiled to fill it; a label from its
    first byte): a stand-in decode that gives a real model real-sized inputs from any file."""
    import numpy as np
    import torch

    size = int(np.prod(shape))
    raw = np.frombuffer(data or b"\0", dtype=np.uint8)
    pixels = np.resize(raw, size).reshape(shape)
    return torch.from_numpy(pixels), int(raw[0]) % classes


def measure_profile(model: Any = "resnet50", *, batch_size: int = 256, input_shape: tuple[int, ...] = (3, 224, 224),
                    steps: int = 30, warmup: int = 10, amp: bool = True, name: str | None = None,
                    device: str = "cuda") -> ComputeProfile:
    """Time ``model``'s training step on this machine's GPU (or ``device``): ``warmup`` steps, then ``steps``
    steps on a synthetic batch already on the device (so no data loading is in the figure)."""
    import torch

    compute = TorchCompute(model, amp=amp, device=device)
    rate = compute.warm_up((batch_size, *input_shape), steps=warmup, measure=steps)
    where = torch.cuda.get_device_name(compute.device) if compute.mode == "cuda" else compute.mode
    return ComputeProfile(name or f"{compute.name.lower()}-measured", compute.name, where, rate, batch_size,
                          f"measured by dataferry.harness.feed.measure_profile on {where} (torch {torch.__version__}), "
                          f"{time.strftime('%Y-%m-%d')}: {steps} steps after {warmup} warm-up, "
                          f"{'float16 autocast' if compute.amp else 'fp32'}, a batch already on the device")
