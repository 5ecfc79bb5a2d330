"""The course layer: the lessons' front door (this module), the helpers behind it (``lesson*``), their findings
(``findings``), the analysis lesson's pooling (``analysis``), the offline lab (``lab``), the data the package
ships (``shipped``) and the ``dataferry`` command (``cli``). It builds on the library and the harness; neither
imports it.

The course's choices in one place: where a lesson reads, where its results go, what it installs.

A lesson runs in two places, and one parameter, the same in every lesson, decides which::

    WHERE = "auto"     # the offline lab off Colab; Google's public sample data in Colab
    WHERE = "lab"      # the offline lab (fake-gcs-server, toxiproxy, gcsfuse; built once with Go)
    WHERE = "public"   # a public bucket read anonymously: no sign-in, no billing, no bucket of yours
    WHERE = "mine"     # your own bucket (BUCKET, PREFIX), with your credentials

Results go where they outlive the runtime when they can: ``$DATAFERRY_HOME`` if set; in Colab, the
``dataferry`` folder of your mounted, writable Drive (``KEEP_ON_DRIVE = True`` in a lesson mounts it),
else ``/content/dataferry`` (lost at disconnect: :meth:`Course.finish` zips it and offers the zip for
download); elsewhere
``~/dataferry``. Paths never depend on the notebook's working directory.

This module imports ``host`` and ``runtime`` (and ``mounts``, only to mount Drive for ``keep_on_drive``);
the lab is the lessons' business.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataferry.host import in_colab
from dataferry.harness.runtime import Region, detect_region
from dataferry.course.shipped import POST_2020, post_quote, public_manifest, shipped_results

__all__ = ["WHERE_CHOICES", "INSTALL_ENV", "HOME_ENV", "IP_LOOKUP_URL", "PublicDataset", "PUBLIC_DATASETS",
           "CloudData", "repository", "install_requirement", "resolve_where", "course_home", "shipped_results",
           "bucket_location", "Course", "POST_2020", "post_quote", "show_table"]

WHERE_CHOICES = ("auto", "lab", "public", "mine")
INSTALL_ENV = "DATAFERRY_INSTALL"
HOME_ENV = "DATAFERRY_HOME"
#: The geo-IP service the 2020 post used; asked in Colab only when the metadata server is silent.
IP_LOOKUP_URL = "https://ipinfo.io/json"
COLAB_CONTENT = Path("/content")
COLAB_DRIVE = COLAB_CONTENT / "drive" / "MyDrive"


@dataclass(frozen=True)
class PublicDataset:
    """Objects that Google documents as publicly readable, read anonymously by the Colab defaults.

    ``location`` is the bucket location Google documents (None where it publishes none: then the
    bucket's own metadata is asked, see :func:`bucket_location`)."""

    name: str
    bucket: str
    prefix: str
    suffix: str
    about: str
    documented_at: str
    location: str | None = None

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"

    def __repr__(self) -> str:
        return f"PublicDataset({self.name!r}, {self.uri!r})"


PUBLIC_DATASETS = {name: PublicDataset(**{k: m[k] for k in ("name", "bucket", "prefix", "suffix", "about", "documented_at")})
                   for name, m in ((n, public_manifest(n)) for n in ("flowers", "landsat-scene"))}


def show_table(table: Any, **to_markdown: Any) -> None:
    """Show a table as a table: in a notebook as rendered markdown (an HTML table in Colab and in the book,
    wrapping to the page), elsewhere as markdown text. ``table`` is markdown text or a DataFrame, whose
    ``to_markdown`` gets ``to_markdown``'s keywords (e.g. ``index=False, floatfmt=".3g"``); a missing
    value (a step some rows do not have) shows as an empty cell, not "nan"."""
    text = table if isinstance(table, str) else table.astype(object).where(table.notna(), None).to_markdown(
        **to_markdown)
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        get_ipython = None
    if get_ipython is None or get_ipython() is None:
        print(text)
    else:
        display(Markdown(text))


def repository() -> str:
    """The project's repository URL, from the installed package's metadata (pyproject's Source)."""
    for entry in importlib.metadata.metadata("dataferry").get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "source":
            return url.strip()
    raise LookupError("the installed dataferry names no Source URL")


def install_requirement() -> str:
    """What a lesson's setup cell gives ``pip install``: ``$DATAFERRY_INSTALL`` replaces it whole."""
    return os.environ.get(INSTALL_ENV) or f"dataferry @ git+{repository()}#subdirectory=helpers"


def resolve_where(where: str = "auto") -> str:
    """``"auto"`` -> ``"public"`` in Colab, ``"lab"`` elsewhere; the other choices stay as given."""
    choice = (where or "auto").strip().lower()
    if choice not in WHERE_CHOICES:
        raise ValueError(f"WHERE = {where!r}: choose one of {', '.join(map(repr, WHERE_CHOICES))}")
    if choice == "auto":
        return "public" if in_colab() else "lab"
    return choice


def course_home(keep_on_drive: bool = False) -> tuple[Path, str]:
    """Where the course writes, and why there (see the module's docstring). ``keep_on_drive`` (Colab only)
    first mounts Drive writable if it is not (Google asks for access in each runtime), so the folder outlives it."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser().absolute(), f"${HOME_ENV}"
    if in_colab():
        def writable() -> bool:
            return COLAB_DRIVE.is_dir() and os.access(COLAB_DRIVE, os.W_OK)

        why_not = ""
        if keep_on_drive and not writable():
            from dataferry.mounts import MountError, mount_drive

            try:
                mount_drive(str(COLAB_DRIVE.parent), readonly=False)
            except MountError as e:  # access refused, or Drive did not answer: the lesson still runs
                why_not = f" (Drive could not be mounted: {e})"
            if not why_not and not writable():
                why_not = (" (Drive is mounted read-only here: run drive.mount('/content/drive', force_remount=True)"
                           " from google.colab, then this cell again)")
        if writable():
            return COLAB_DRIVE / "dataferry", "your mounted Google Drive: it outlives this runtime"
        return COLAB_CONTENT / "dataferry", (
            "this runtime's disk, deleted at disconnect: download the zip at the end, or set KEEP_ON_DRIVE = True"
            + why_not)
    return Path.home() / "dataferry", "your home folder"


def bucket_location(client: Any, bucket: str, documented: str | None = None) -> tuple[str, str]:
    """(location, how it was found): the bucket's metadata, else what Google documents, else unknown.

    Reading bucket metadata needs ``storage.buckets.get``, which anonymous readers of a public
    bucket usually lack; the answer says so rather than guessing."""
    try:
        return str(client.get_bucket(bucket).location), "bucket metadata"
    except Exception as e:  # noqa: BLE001 - forbidden, missing or offline: all mean "not from here"
        why = type(e).__name__
    if documented:
        return documented, f"documented (metadata not readable: {why})"
    return "unknown", f"not readable here ({why}) and not documented"


@dataclass(frozen=True)
class CloudData:
    """The bucket a non-lab run reads, with the client that reads it and where the bucket is."""

    client: Any
    bucket: str
    prefix: str
    suffix: str
    location: str
    location_source: str
    anonymous: bool

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"

    def __repr__(self) -> str:
        who = "anonymously" if self.anonymous else "with your credentials"
        return f"CloudData({self.uri!r}, {who}, location={self.location!r})"


def _kept_rows(path: Path, columns: list[str], name: str) -> Any:
    """The rows kept in ``path``, every value as it was written, when their columns differ from ``columns`` (the file is
    then written again, whole); None when rows go on its end: there is no file (an empty one is removed, one that does
    not read as a table is moved aside, unchanged, and said so), or it has the same columns in the same order."""
    import pandas as pd

    if not path.exists():
        return None
    if not path.stat().st_size:
        path.unlink()
        return None
    try:
        if list(pd.read_csv(path, nrows=0).columns) == columns:
            return None  # appended under its header: the file is not read whole
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        os.replace(path, aside)
        warnings.warn(f"{name} does not read as a table (an older version may have appended rows with other columns): "
                      f"kept as {aside.name} beside it, unchanged; this run's rows start a new {path.name}",
                      UserWarning, stacklevel=3)
        return None


class Course:
    """One lesson's run: where it reads, where its results and figures go, and how it ends.

    ``results_dir`` / ``figures_dir`` given (papermill, ``make course``) are used as they are;
    empty ones follow :func:`course_home`; ``keep_on_drive`` puts them on your Drive in Colab, where every
    lesson (each in a runtime of its own) finds them."""

    def __init__(self, lesson: str, where: str = "auto", results_dir: str = "", figures_dir: str = "",
                 keep_on_drive: bool = False) -> None:
        self.lesson = lesson
        self.where = resolve_where(where)
        self.colab = in_colab()
        home, self.home_reason = course_home(keep_on_drive)
        self.home = home
        self._passed_in = [name for name, folder in (("RESULTS_DIR", results_dir), ("FIGURES_DIR", figures_dir)) if folder]
        self.results_dir = Path(results_dir).expanduser().absolute() if results_dir else home / "results"
        self.figures_dir = Path(figures_dir).expanduser().absolute() if figures_dir else home / "figures"
        self.results_dir.mkdir(parents=True, exist_ok=True)
        self.figures_dir.mkdir(parents=True, exist_ok=True)
        self._scratch: list[Path] = []
        self._undo: list[Any] = []

    def public(self, name: str = "flowers") -> PublicDataset:
        """A public data set by name (see :data:`PUBLIC_DATASETS`)."""
        try:
            return PUBLIC_DATASETS[name]
        except KeyError:
            raise ValueError(f"no public data set {name!r}: choose one of {', '.join(PUBLIC_DATASETS)}") from None

    def client(self, project: str = "") -> Any:
        """A google-cloud-storage client for this run: anonymous for ``public``, yours for ``mine``.

        Both honour ``STORAGE_EMULATOR_HOST``, the one variable that points them elsewhere."""
        from google.cloud import storage

        if self.where == "public":
            return storage.Client.create_anonymous_client()
        if self.where == "mine":
            from dataferry.mounts import NotInColab, authenticate
            from dataferry.sources.gcs import signed_in_client

            try:
                authenticate()
            except NotInColab:
                pass  # off Colab: application-default credentials, as storage.Client() finds them
            return signed_in_client("your bucket", project=project or None)
        raise ValueError("the lab has its own client: lab.client()")

    def cloud_data(self, bucket: str = "", prefix: str = "", project: str = "", dataset: str = "flowers") -> CloudData:
        """What a ``public`` or ``mine`` run reads: the public data set, or your ``bucket``/``prefix``."""
        if self.where == "public":
            public = self.public(dataset)
            client = self.client()
            location, how = bucket_location(client, public.bucket, public.location)
            return CloudData(client, public.bucket, public.prefix, public.suffix, location, how, True)
        if self.where == "mine":
            if not bucket:
                raise ValueError("WHERE = 'mine' reads your own bucket: set BUCKET (and PREFIX) in the parameters "
                                 "cell, or use WHERE = 'public' for Google's public sample data")
            client = self.client(project)
            location, how = bucket_location(client, bucket)
            return CloudData(client, bucket, prefix, "", location, how, False)
        raise ValueError("the lab makes its own data: lab_target() or lab.make_dataset()")

    def images(self, n: int, *, seed: int = 0, bucket: str = "", prefix: str = "", profile: str = "colocated",
               held_out: int = 0) -> Any:
        """This lesson's ``n`` flower images, wherever it runs: see :func:`dataferry.course.lessondata.images`."""
        from dataferry.course.lessondata import images

        return images(self, n, seed=seed, bucket=bucket, prefix=prefix, profile=profile, held_out=held_out)

    def checkpoint_places(self, drive_folder: str = "", bucket: str = "", prefix: str = "",
                          profile: str = "same-continent") -> Any:
        """Where lesson 10 saves: see :func:`dataferry.course.lessondata.checkpoint_places`."""
        from dataferry.course.lessondata import checkpoint_places

        return checkpoint_places(self, drive_folder, bucket, prefix, profile)

    def local_files(self, n: int, size: int, given: str = "", seed: int = 0) -> Any:
        """Files on this runtime's disk to time: see :func:`dataferry.course.lessondata.local_files`."""
        from dataferry.course.lessondata import local_files

        return local_files(self, n, size, given, seed)

    def methods_run(self, methods: list[str], n_files: int, repeats: int, **where: Any) -> Any:
        """Every method's first read and re-read: see :func:`dataferry.course.lessondata.methods_run`."""
        from dataferry.course.lessondata import methods_run

        return methods_run(self, methods, n_files, repeats, **where)

    def pooled_runs(self, extra: list[str], shipped: bool = True, **options: Any) -> Any:
        """Every run pooled for the analysis: see :func:`dataferry.course.lessondata.pooled_runs`."""
        from dataferry.course.lessondata import pooled_runs

        return pooled_runs(self, extra, shipped, **options)

    def drive(self, n: int, size: int, **where: Any) -> Any:
        """Google Drive in Colab (Google asks), else a stand-in that says why: see
        :func:`dataferry.course.lessondrive.drive_files`."""
        from dataferry.course.lessondrive import drive_files

        return drive_files(self, n, size, **where)

    def files(self, n: int, size: int, **where: Any) -> Any:
        """Files in a bucket to mount and measure: see :func:`dataferry.course.lessonfiles.lesson_files`."""
        from dataferry.course.lessonfiles import lesson_files

        return lesson_files(self, n, size, **where)

    def large_files(self, n: int, mib: int, **where: Any) -> Any:
        """Large files for gcsfuse's knobs: see :func:`dataferry.course.lessonfiles.large_files`."""
        from dataferry.course.lessonfiles import large_files

        return large_files(self, n, mib, **where)

    def on_finish(self, undo: Any) -> None:
        """Call ``undo()`` at :meth:`finish` (an unmount, a bucket to delete), before the results are zipped."""
        self._undo.append(undo)

    def folder(self, given: str, name: str) -> Path:
        """``given`` if set (e.g. ``CACHE_DIR = "/content/cache"``), else a fresh temporary folder that
        :meth:`finish` removes."""
        if given:
            return Path(given).expanduser()
        path = Path(tempfile.mkdtemp(prefix=f"{self.lesson[:2]}-{name}-"))
        self._scratch.append(path)
        return path

    def keep(self, rows: Any, name: str, **columns: Any) -> Path:
        """Append ``rows`` (dicts or a DataFrame) to the CSV ``name`` under the results folder, each with
        ``columns`` (e.g. ``where=data.label``) and the time it was kept: every run's rows stay. Rows whose columns
        differ from the file's (a later version's) are not appended under its header: the file is written again,
        whole, with every column (empty where a row has none). A file that does not read as a table is moved aside,
        unchanged, and said so."""
        import pandas as pd

        path = self.results_dir / name
        if len(rows) == 0:
            return path  # nothing measured: no header without rows
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pd.DataFrame(rows).assign(**columns, time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        kept = _kept_rows(path, list(table.columns), name)
        if kept is None:
            table.to_csv(path, mode="a", header=not path.exists(), index=False)
            return path
        whole = pd.concat([kept, table.astype(object)], ignore_index=True)  # a whole number stays whole beside gaps
        partial = path.with_name(f".{path.name}.partial")
        whole.to_csv(partial, index=False)
        os.replace(partial, path)  # never half a file, even if this run is stopped now
        return path

    def region(self, override: str = "", lab_profile: str | None = None) -> Region:
        """Where this run is, and which source said so; in Colab a geo-IP lookup backs the metadata server."""
        return detect_region(override or None, lab_profile=lab_profile,
                             ip_lookup_url=IP_LOOKUP_URL if self.colab and not lab_profile else None)

    def finish(self) -> Path | None:
        """Zip everything measured so far (results and figures); in Colab, offer it for download.

        Returns the zip's path, or None where the results already live somewhere lasting. The temporary
        folders of :meth:`folder` are removed."""
        while self._undo:
            self._undo.pop()()
        for path in self._scratch:
            shutil.rmtree(path, ignore_errors=True)
        self._scratch.clear()
        if self.colab and str(self.home).startswith(str(COLAB_DRIVE)):
            print(f"Results are on your Drive ({self.home}): nothing to download.")
            return None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        staging = self.results_dir.parent / "downloads" / f"dataferry-{self.lesson}-{stamp}"  # next to the results
        for folder in (self.results_dir, self.figures_dir):
            if folder.is_dir():
                shutil.copytree(folder, staging / folder.name, dirs_exist_ok=True)
        archive = Path(shutil.make_archive(str(staging), "zip", root_dir=staging))
        shutil.rmtree(staging)
        print(f"Everything measured so far is in {archive} ({archive.stat().st_size / 1e6:.1f} MB).")
        if self.colab:
            from dataferry.mounts import download

            download(archive)
        return archive

    def describe(self) -> str:
        """Two lines for the lesson's output: what it reads and where its results go."""
        reads = {"lab": "the offline lab (lab:<profile> numbers, never cloud numbers)",
                 "public": "Google's public sample data, anonymously (real GCS, from wherever this runtime is)",
                 "mine": "your own bucket, with your credentials"}[self.where]
        region = ("\nregion: the GCE metadata server's zone, else a geo-IP lookup of this runtime's public address "
                  f"({IP_LOOKUP_URL}), else unknown" if self.colab and self.where != "lab" else "")
        if len(self._passed_in) == 2:
            why = "both as passed in"
        elif self._passed_in:
            other = "figures" if self._passed_in[0] == "RESULTS_DIR" else "results"
            why = f"{self._passed_in[0]} as passed in; {other} under {self.home}: {self.home_reason}"
        else:
            why = self.home_reason
        return (f"WHERE = {self.where!r}: this run reads {reads}.\n"
                f"results -> {self.results_dir}, figures -> {self.figures_dir} ({why})" + region)

    def __repr__(self) -> str:
        return f"Course({self.lesson!r}, where={self.where!r}, home={str(self.home)!r})"
