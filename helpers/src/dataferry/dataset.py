"""PyTorch: a map-style Dataset that reads every sample through a :class:`~dataferry.Cache`.

The dataset lists the source once (sorted by name) and reads those versions: a sample already
cached is read as listed, one replaced at the source before it was cached is read in its new
version (never a mix). Call :meth:`refresh` to pick up every change. It pickles without live
clients or connections, so it works in DataLoader workers under fork and spawn; each worker opens
its own. The listing is held as an :class:`~dataferry.sources.EntryTable`: 32 bytes per
object plus its name, version and checksum, in a few flat buffers that forked workers share.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any, cast

from torch.utils.data import Dataset, Sampler

from dataferry.cache import Cache, DamagedAtSource
from dataferry.cache.checksum import b64
from dataferry.cache.fill import MIN_FILL_BYTES_PER_S, damage
from dataferry.cache.known import KnownCopies
from dataferry.cache.transport import Sink, fetch_whole
from dataferry.decode import DecodedImages, image_errors, picture_bytes, pil_loader, pixels
from dataferry.sources import (DEFAULT_RETRY_DEADLINE_S, ChangedAtSource, Entry, EntryTable, NotFoundAtSource,
                               Source, reads_wait_on_network, top_folders, where)
from dataferry.staging import Prefetcher

__all__ = ["CachedDataset", "CachedImageFolder", "PrefetchingSampler", "SourceDataset", "IMG_EXTENSIONS", "pil_loader"]


class CachedDataset(Dataset):
    """Sample ``i`` is ``decode(bytes of the i-th object)`` (bytes if ``decode`` is None), checked against
    the object's CRC32C on every read (the source's, or the one computed when it was filled; a copy
    damaged on local disk since is read again, never returned): about 13 us more than an unchecked
    read of a 64 KiB object from a warm cache (30 us instead of 17 us here). A sample read again, by the process
    that listed the dataset or a DataLoader worker forked from it, is checked against the CRC32C that a first read
    learned of its bytes, with no query of the cache's index (:class:`~dataferry.cache.known.KnownCopies`).

    ``names`` restricts the dataset to those objects, in that order. ``decode`` must be
    picklable (a module-level function) for DataLoader workers under spawn. A sample once read is
    demoted in the cache: under a budget, room comes from samples read this epoch before those
    fetched ahead and not yet read.

        ds = CachedDataset(GCSSource("my-bucket", "train/"), Cache("/content/cache"), decode=decode_jpeg)
        loader = DataLoader(ds, batch_size=64, num_workers=4, sampler=ds.prefetching(RandomSampler(ds)))
    """

    _copies: KnownCopies | None = None  # what reads learned of each sample's copy (see __setattr__)

    def __init__(self, source: Source, cache: Cache, decode: Callable[[bytes], Any] | None = None,
                 names: Sequence[str] | None = None) -> None:
        self.source, self.cache, self.decode = source, cache, decode
        self._names = list(names) if names is not None else None
        self.refresh()

    def refresh(self) -> None:
        """List the source again, to read objects that changed since."""
        if self._names is None:
            self._listed(EntryTable(self.source.list(), sort_by_name=True))
        else:
            self._listed(EntryTable(self.source.stat(n) for n in self._names))

    def _listed(self, entries: EntryTable) -> None:
        """Read ``entries`` from now on, and nothing learned of an earlier listing."""
        self._replaced: dict[int, Entry] = {}  # samples found replaced at the source since the listing
        self.entries = entries

    def __setattr__(self, name: str, value: Any) -> None:
        """Setting what decides which copy a sample reads (the listing, the source, decode-once's decoding) gives the
        dataset a new table of what reads learn, made here, before DataLoader workers fork, so that they share it. A
        read under way meanwhile learns into neither table."""
        deciding = name in ("entries", "source", "decoded")
        if deciding:
            super().__setattr__("_copies", None)
        super().__setattr__(name, value)
        if deciding and "entries" in self.__dict__:
            super().__setattr__("_copies", KnownCopies(len(self.entries)))

    def __copy__(self) -> CachedDataset:
        """``copy.copy`` (to give a dataset another transform or decoding): a dataset like this one, whose reads
        learn on their own (each of ``compare_decoders``' pipelines is timed from its own start)."""
        twin = type(self).__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin._replaced = dict(self._replaced)
        twin.entries = self.entries
        return twin

    def __len__(self) -> int:
        return len(self.entries)

    def entry(self, index: int) -> Entry:
        """Sample ``index``'s object, in the version this dataset reads."""
        index = range(len(self.entries))[index]
        return self._replaced.get(index) or self.entries[index]

    def __getitem__(self, index: int) -> Any:
        data = self._bytes(index)
        return self.decode(data) if self.decode is not None else data

    def _bytes(self, index: int) -> bytes:
        """Sample ``index``'s bytes as the cache keeps them, checked: a sample read before, by this process or a
        DataLoader worker forked from it, is read by what that read learned of its copy (:class:`KnownCopies`)."""
        index = range(len(self.entries))[index]
        used_up = self.cache.max_bytes is not None  # under a budget: room comes from what this epoch has read
        copies = self._copies if index not in self._replaced else None  # it holds what reads of listed versions learned
        data = copies.read(self.cache, index, used_up) if copies is not None else None
        if data is not None:
            return data
        entry = self.entry(index)
        source, read = self._kept_as(entry)
        try:
            data = self.cache.read_verified(source, read)
        except ChangedAtSource:
            # Replaced since listing and not cached: read the current version rather than fail.
            self._replaced[index] = entry = self.source.stat(entry.name)
            source, read = self._kept_as(entry)
            data = self.cache.read_verified(source, read)
        if used_up:
            self.cache.demote(source, [read])
        if copies is not None and copies is self._copies and index not in self._replaced:  # nothing set or found since
            copies.learn(index, self.cache.key(source, read), data[:self._bytes_used(data)])
        return data

    def _kept_as(self, entry: Entry) -> tuple[Source, Entry]:
        """What the cache keeps of ``entry``, as (source, entry): the object itself."""
        return self.source, entry

    def _bytes_used(self, data: bytes) -> int:
        """How many of a sample's first bytes it uses (all)."""
        return len(data)

    def needs_source(self, entry: Entry) -> bool:
        """Whether reading the entry's sample needs its object from the source, unless cached: here always, so
        the prefetching sampler fetches every entry ahead that is not cached."""
        return True

    def prefetching(self, sampler: Sampler[int] | Sequence[int], ahead: int | None = None) -> PrefetchingSampler:
        """Wrap ``sampler`` so that, as the DataLoader draws indices, samples up to ``ahead`` past
        the one drawn are fetched into the cache in the background by the main process, at most
        256 at once from a bucket (on its download loop), 32 from a folder (on as many threads);
        ``ahead`` defaults to four times that (see :class:`~dataferry.Prefetcher`). Under a cache budget
        the fills ahead take at most half of it; keep the DataLoader's own read-ahead (``batch_size *
        num_workers * prefetch_factor`` samples) within the other half, or what was fetched for it is
        evicted before it is read. A folder on local disk (not a Drive or gcsfuse mount: ``source.remote`` is
        False) is not fetched ahead, and ``ahead`` is not used: reading it waits on no network, and the
        workers, each in its own process, fill the cache from it faster than the main process's threads,
        which only race them for the same files (in one run, 14 workers: epoch 1 at 0.58x plain reads with
        them, 0.97x without). With ``num_workers=0`` nothing reads ahead of the loop there either."""
        return PrefetchingSampler(self, sampler, ahead)

    @property
    def total_bytes(self) -> int:
        return self.entries.total_bytes + sum(e.size - self.entries[i].size for i, e in self._replaced.items())

    def __repr__(self) -> str:
        return (f"<CachedDataset {len(self)} samples, {self.total_bytes / 1e6:.1f} MB from {self.source!r} "
                f"via {self.cache.root}>")


#: The file names ImageFolder takes as images (torchvision's ``IMG_EXTENSIONS``), compared in lower case.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class CachedImageFolder(CachedDataset):
    """``torchvision.datasets.ImageFolder`` over any source, read through the cache: objects named
    ``<class>/.../<file>.jpg`` under the source (a bucket prefix, a Drive folder, a gcsfuse mount), the class
    from the first folder of the name. Same attributes and call as torchvision's, so a training script
    switches with one line::

        # ds = torchvision.datasets.ImageFolder("/content/flowers", transform=tf)
        ds = CachedImageFolder(GCSSource("cloud-samples-data", "ai-platform/flowers/"), Cache("/content/cache"),
                               transform=tf)

    ``classes`` (sorted folder names), ``class_to_idx``, ``samples`` / ``imgs`` (``(name, class_index)``,
    sorted), ``targets``; ``ds[i]`` is ``(transform(loader(bytes)), target_transform(class_index))``.
    ``loader`` takes the object's bytes (default: :func:`pil_loader`); ``is_valid_file`` takes its name
    (default: an :data:`IMG_EXTENSIONS` suffix).

    ``decode_once=256``: each image is decoded once, the whole picture with its shorter side 256 and its aspect
    kept (:class:`~dataferry.decode.DecodedImages`), and kept in the cache; ``transform`` then gets a ``3 x H x W``
    uint8 tensor instead of a PIL image (use torchvision's v2 transforms, e.g. ``RandomResizedCrop(224)``, on it: its
    crops draw from the same picture as on the JPEG), and later epochs pay no JPEG decode. Objects not in a class folder are left out, as
    ImageFolder leaves out files beside the class folders. Every read is checked against the object's
    CRC32C (see :class:`CachedDataset`). Picklable for DataLoader workers under fork and spawn when
    ``transform``, ``target_transform`` and ``loader`` are (torchvision's transforms are)."""

    def __init__(self, source: Source, cache: Cache, transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None, loader: Callable[[bytes], Any] = pil_loader,
                 is_valid_file: Callable[[str], bool] | None = None, allow_empty: bool = False,
                 decode_once: int | None = None) -> None:
        self.transform, self.target_transform, self.loader = transform, target_transform, loader
        self.is_valid_file, self.allow_empty = is_valid_file, allow_empty
        self.decoded = DecodedImages(source, cache, decode_once) if decode_once else None
        super().__init__(source, cache)

    def needs_source(self, entry: Entry) -> bool:
        """Whether reading the image will need its JPEG: decode-once needs none once its record is cached (a
        warm epoch's prefetching then fetches nothing, and under a budget does not bring evicted JPEGs back)."""
        return self.decoded is None or not self.cache.contains(*self._kept_as(entry))

    def _kept_as(self, entry: Entry) -> tuple[Source, Entry]:
        """What the cache keeps of ``entry``: the image itself, or decode-once's record of it."""
        return (self.source, entry) if self.decoded is None else (self.decoded, self.decoded.entry(entry))

    def _bytes_used(self, data: bytes) -> int:
        """How many of a sample's first bytes it uses: all of an image's, a record's picture (not its padding)."""
        return len(data) if self.decoded is None else picture_bytes(data)

    def refresh(self) -> None:
        """List the source again: classes, samples and targets follow what it holds now. Exactly as ImageFolder:
        the classes are every folder at the top, empty and hidden ones included (a Jupyter
        ``.ipynb_checkpoints`` too), whatever ``is_valid_file`` keeps, so two datasets over one source number
        them alike; samples go class by class, and within one, folder by folder, through links; no class folder
        at all is an error, and so is a class with no valid file unless ``allow_empty``."""
        valid = self.is_valid_file or (lambda name: name.lower().endswith(IMG_EXTENSIONS))
        listed_all = list(self.source.list())
        self.classes = top_folders(self.source, listed_all)
        if not self.classes:
            raise NotFoundAtSource(f"no valid image in any class folder under {self.source.uri}: it has no folder at "
                                   "the top, and ImageFolder reads <class>/<file>.jpg (check the path or prefix)")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

        def order(e: Entry) -> tuple[str, str, str]:
            folder, _, file = e.name.rpartition("/")
            return e.name.split("/", 1)[0], folder, file

        listed = sorted((e for e in listed_all if "/" in e.name and e.name.split("/", 1)[0] in self.class_to_idx
                         and valid(e.name)), key=order)
        empty = set(self.classes) - {e.name.split("/", 1)[0] for e in listed}
        if empty and not self.allow_empty:
            raise NotFoundAtSource(_no_valid_file(self.source.uri, sorted(empty), listed))
        self._listed(EntryTable(listed))
        self.targets = [self.class_to_idx[e.name.split("/", 1)[0]] for e in listed]
        #: ``(object name, class index)`` of every image, as ImageFolder's ``samples`` (names, not paths).
        self.samples = [(e.name, t) for e, t in zip(listed, self.targets)]
        self.imgs = self.samples

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if self.decoded is None:
            data = self._bytes(index)
            with image_errors(lambda: where(self.source, self.entry(index).name)):
                sample = self.loader(data)
        else:
            sample = pixels(self._bytes(index))
        target: Any = self.targets[range(len(self.entries))[index]]
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __repr__(self) -> str:
        return (f"<CachedImageFolder {len(self)} images in {len(self.classes)} classes from {self.source!r} "
                f"via {self.cache.root}>")


def _no_valid_file(uri: str, empty: list[str], listed: list[Entry]) -> str:
    """What to do about class folders with no valid file (ImageFolder refuses them, as do we)."""
    hidden = [c for c in empty if c.startswith(".")]
    what = (f"no valid image in any class folder under {uri}" if not listed
            else f"no valid image for the classes {', '.join(empty)} under {uri}")
    advice = ("ImageFolder reads <class>/<file>.jpg and numbers every folder at the top as a class: check the path "
              "or prefix, pass is_valid_file, or allow_empty=True")
    if hidden:
        advice = (f"{', '.join(hidden)} {'is a hidden folder' if len(hidden) == 1 else 'are hidden folders'} "
                  "(Jupyter makes .ipynb_checkpoints) that ImageFolder counts as a class: delete "
                  f"{'it' if len(hidden) == 1 else 'them'}, or pass allow_empty=True (the class numbers then "
                  "include it, as torchvision's do)")
    return f"{what}: {advice}"


class SourceDataset(Dataset):
    """Sample ``i`` is ``decode(bytes of entries[i])`` read straight from ``source`` on every access, with no
    cache: what a Dataset over a Drive or gcsfuse mount, or one that downloads in ``__getitem__``, does.
    The course's baseline for every method that pays the remote each epoch. Each read is retried as a
    google-cloud-storage read is (transient errors, within the source's ``retry_deadline_s``), resuming from
    the bytes it has, and checked against the object's size and CRC32C, as the cache's are."""

    def __init__(self, source: Source, entries: Iterable[Entry], decode: Callable[[bytes], Any] | None = None) -> None:
        self.source, self.decode = source, decode
        self.entries = EntryTable(entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> Any:
        entry = self.entries[index]
        sink = Sink("", entry.size, held=True)
        patience = max(getattr(self.source, "retry_deadline_s", DEFAULT_RETRY_DEADLINE_S),
                       entry.size / MIN_FILL_BYTES_PER_S)
        n, crc = fetch_whole(self.source, entry, sink, time.monotonic() + patience, lambda **_: None)
        why = damage(entry, n, b64(crc))
        if why:
            raise DamagedAtSource(f"{where(self.source, entry.name)}: {why}; the object or the connection is damaged")
        data = bytes(sink.held or b"")
        return self.decode(data) if self.decode is not None else data

    def __repr__(self) -> str:
        return f"<SourceDataset {len(self)} samples from {self.source!r}, no cache>"


class PrefetchingSampler(Sampler[int]):
    """Yields the wrapped sampler's indices while the ones up to ``ahead`` past the reader are fetched
    (from a bucket or a network mount; a folder on local disk is left to the workers)."""

    def __init__(self, dataset: CachedDataset, sampler: Sampler[int] | Sequence[int], ahead: int | None = None) -> None:
        self.dataset, self.sampler, self.ahead = dataset, sampler, ahead
        self.prefetcher: Prefetcher | None = None

    def __len__(self) -> int:
        return len(cast(Sized, self.sampler))

    def __iter__(self) -> Iterator[int]:
        if not reads_wait_on_network(self.dataset.source):
            yield from self.sampler  # local disk: the workers fill faster than one process's threads
            return
        order = array("q", self.sampler)  # 8 bytes a sample, not a list of ints
        entries = _InOrder(self.dataset, order)
        needs_source = self.dataset.needs_source
        with Prefetcher(self.dataset.source, self.dataset.cache, entries, self.ahead, needs_source=needs_source) as pf:
            self.prefetcher = pf
            for position, index in enumerate(order):
                pf.advance(position)
                yield index


class _InOrder(Sequence):
    """The dataset's entries in a sampler's order, each made only when the prefetcher reaches it."""

    def __init__(self, dataset: CachedDataset, order: array) -> None:
        self.dataset, self.order = dataset, order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, position):  # type: ignore[override]
        return self.dataset.entry(self.order[position])
