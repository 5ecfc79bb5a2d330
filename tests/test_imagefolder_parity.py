"""CachedImageFolder numbers, lists and refuses exactly as torchvision's ImageFolder does, over the folder
layouts Colab users have: empty class folders, links, hidden folders (Jupyter's ``.ipynb_checkpoints``),
files beside the classes, nested folders, spaces, non-ASCII names and upper-case extensions. A label that
shifts against torchvision's trains a model on wrong data without a word."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from dataferry import Cache, CachedImageFolder, LocalSource  # noqa: E402
from dataferry.course.lab.flowers import flower_jpeg  # noqa: E402


def _jpeg(path, seed: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(flower_jpeg("roses", seed))


def _theirs(root, **kw):
    try:
        ds = torchvision.datasets.ImageFolder(str(root), **kw)
    except Exception as e:  # noqa: BLE001 - what torchvision raises is what we must raise
        return type(e)
    return ds.classes, ds.class_to_idx, [(p[len(str(root)) + 1:], t) for p, t in ds.samples], ds.targets


def _ours(root, cache, **kw):
    try:
        ds = CachedImageFolder(LocalSource(root), cache, **kw)
    except Exception as e:  # noqa: BLE001
        return type(e)
    assert ds.imgs == ds.samples and len(ds) == len(ds.samples)
    return ds.classes, ds.class_to_idx, ds.samples, ds.targets


def _layout(root, outside) -> None:
    """Every odd case at once, under ``root``; ``outside`` holds what links point to."""
    _jpeg(root / "cat" / "1.jpg")
    _jpeg(root / "cat" / "2.JPG", 2)  # upper-case extension
    _jpeg(root / "cat" / "deep" / "er" / "3.jpeg", 3)  # nested folders
    _jpeg(root / "cat" / "deep-er" / "4.png", 4)  # sorts between deep and deep/er
    _jpeg(root / "cat" / ".hidden" / "5.jpg", 5)  # a hidden folder inside a class
    (root / "cat" / "notes.txt").write_text("not an image")
    _jpeg(root / "dog house" / "café 1.jpg", 6)  # spaces and non-ASCII
    _jpeg(root / "ünïcode" / "x.webp", 7)
    _jpeg(root / "top-level.jpg", 8)  # a file beside the classes
    (root / "labels.csv").write_text("a,b")
    _jpeg(outside / "linked-class" / "a.jpg", 9)
    (root / "linked").symlink_to(outside / "linked-class")  # a class folder that is a link
    _jpeg(outside / "lone.jpg", 10)
    (root / "cat" / "link.jpg").symlink_to(outside / "lone.jpg")  # a file that is a link
    _jpeg(outside / "sub" / "b.jpg", 11)
    (root / "cat" / "linked-sub").symlink_to(outside / "sub")  # a folder in a class that is a link
    (root / "dangling.jpg").symlink_to(outside / "nothing-here")  # a link to nothing, beside the classes


@pytest.mark.parametrize("allow_empty", [True, False])
@pytest.mark.parametrize("extra", ["nothing", "empty class", ".ipynb_checkpoints", "hidden class with images"])
def test_classes_samples_targets_and_errors_are_image_folders(tmp_path, allow_empty, extra):
    root, outside = tmp_path / "data", tmp_path / "outside"
    _layout(root, outside)
    if extra == "empty class":
        (root / "bird").mkdir()
    elif extra == ".ipynb_checkpoints":
        (root / ".ipynb_checkpoints").mkdir()
    elif extra == "hidden class with images":
        _jpeg(root / ".trash" / "old.jpg", 12)
    cache = Cache(tmp_path / "cache", min_free_bytes=0)
    theirs, ours = _theirs(root, allow_empty=allow_empty), _ours(root, cache, allow_empty=allow_empty)
    if isinstance(theirs, type):
        assert isinstance(ours, type) and issubclass(ours, theirs), "the error torchvision raises (or a subclass)"
    else:
        assert ours == theirs
    if extra != "nothing" and extra != "hidden class with images" and not allow_empty:
        assert theirs is FileNotFoundError, "torchvision refuses a class with no image"


def test_an_empty_class_shifts_no_label(tmp_path):
    """The issue's case: torchvision gives bird 0, cat 1, dog 2 with an empty 'bird'; so must we."""
    root = tmp_path / "data"
    (root / "bird").mkdir(parents=True)
    _jpeg(root / "cat" / "1.jpg")
    _jpeg(root / "dog" / "1.jpg", 2)
    ds = CachedImageFolder(LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0), allow_empty=True)
    assert ds.class_to_idx == {"bird": 0, "cat": 1, "dog": 2} and ds.targets == [1, 2]
    with pytest.raises(FileNotFoundError, match="bird"):
        CachedImageFolder(LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0))


def test_no_class_folder_at_all_is_refused_even_with_allow_empty(tmp_path):
    root = tmp_path / "data"
    _jpeg(root / "a.jpg")
    assert _theirs(root, allow_empty=True) is FileNotFoundError
    with pytest.raises(FileNotFoundError, match="class folder"):
        CachedImageFolder(LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0), allow_empty=True)


def test_the_samples_read_the_same_pixels_through_links(tmp_path):
    root, outside = tmp_path / "data", tmp_path / "outside"
    _layout(root, outside)
    tf = torchvision.transforms.PILToTensor()
    theirs = torchvision.datasets.ImageFolder(str(root), transform=tf)
    ours = CachedImageFolder(LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0), transform=tf)
    for i in range(len(theirs)):
        (a, ta), (b, tb) = ours[i], theirs[i]
        assert torch.equal(a, b) and ta == tb, ours.samples[i]


def test_an_ipynb_checkpoints_folder_is_named_in_the_error_with_what_to_do(tmp_path):
    root = tmp_path / "data"
    _jpeg(root / "cat" / "1.jpg")
    (root / ".ipynb_checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match=r"\.ipynb_checkpoints.*(delete|remove)"):
        CachedImageFolder(LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0))


def test_a_link_round_a_loop_is_walked_once_and_links_can_be_refused(tmp_path):
    root = tmp_path / "data"
    _jpeg(root / "cat" / "1.jpg")
    (root / "cat" / "again").symlink_to(root / "cat")  # a loop
    (root / "dog").symlink_to(root / "cat")  # another class through a link: its own path
    ds = CachedImageFolder(LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0))
    assert ds.samples == [("cat/1.jpg", 0), ("dog/1.jpg", 1)]
    strict = LocalSource(root, follow_links=False)
    assert [e.name for e in strict.list()] == ["cat/1.jpg"] and strict.folders() == ["cat"]


def test_a_bucket_numbers_an_empty_folder_placeholder_as_a_class_as_a_gcsfuse_mount_shows_it(lab_env, lab_bucket,
                                                                                              tmp_path):
    from dataferry import GCSSource

    lab_bucket.blob("train/bird/").upload_from_string(b"")  # the Cloud console's empty folder
    lab_bucket.blob("train/cat/1.jpg").upload_from_string(flower_jpeg("roses", 1))
    lab_bucket.blob("train/dog/sub/2.jpg").upload_from_string(flower_jpeg("roses", 2))
    lab_bucket.blob("train/top.jpg").upload_from_string(flower_jpeg("roses", 3))
    lab_bucket.blob("trainee/x/3.jpg").upload_from_string(flower_jpeg("roses", 3))  # another prefix
    source = GCSSource(lab_bucket.name, "train")
    assert source.folders() == ["bird", "cat", "dog"]
    ds = CachedImageFolder(source, Cache(tmp_path / "c", min_free_bytes=0), allow_empty=True)
    assert ds.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
    assert ds.samples == [("cat/1.jpg", 1), ("dog/sub/2.jpg", 2)]
    with pytest.raises(FileNotFoundError, match="bird"):
        CachedImageFolder(source, Cache(tmp_path / "c", min_free_bytes=0))


def _bad_images(root):
    """A class folder holding a good image and three bad ones."""
    good = flower_jpeg("roses", 1)
    _jpeg(root / "cat" / "0-good.jpg")
    (root / "cat" / "1-truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "cat" / "2-garbage.jpg").write_bytes(b"\x89PNG not really" + bytes(range(256)) * 20)
    _jpeg(root / "cat" / "3-bomb.jpg", 3)  # over the pixel limit the test sets


@pytest.mark.parametrize("decode_once", [None, 64])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_bad_image_is_one_error_that_names_it(tmp_path, monkeypatch, decode_once, workers):
    """Truncated, not an image, a decompression bomb: each says which object and what to do (PIL's own message
    named '<_io.BytesIO object at 0x...>'), with and without decode-once, in DataLoader workers too."""
    import torchvision.transforms.v2  # noqa: F401
    from PIL import Image
    from torch.utils.data import DataLoader

    from dataferry import DataferryError

    root = tmp_path / "data"
    _bad_images(root)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 30_000)  # a flower has ~190,000: over twice this is a bomb
    ds = CachedImageFolder(LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0), decode_once=decode_once,
                           transform=torchvision.transforms.v2.Resize((32, 32)) if decode_once else
                           torchvision.transforms.Compose([torchvision.transforms.Resize((32, 32)),
                                                           torchvision.transforms.PILToTensor()]))
    for i in (1, 2, 3):
        name = ds.samples[i][0]
        loader = DataLoader(torch.utils.data.Subset(ds, [i]), num_workers=workers)
        with pytest.raises(Exception) as caught:
            next(iter(loader))
        text = str(caught.value)
        said = text.strip().splitlines()[-1]  # a worker's error carries its traceback before the message
        assert name in said and "BytesIO" not in said, text
        assert "is_valid_file" in text or "MAX_IMAGE_PIXELS" in text, text
        if workers == 0:
            assert isinstance(caught.value, DataferryError) and isinstance(caught.value, OSError)
            assert len(text.splitlines()) == 1, text


def test_a_sample_that_became_a_folder_since_the_listing_is_named_as_such(tmp_path):
    from dataferry import DataferryError

    root = tmp_path / "data"
    _jpeg(root / "cat" / "1.jpg")
    _jpeg(root / "cat" / "2.jpg", 2)
    ds = CachedImageFolder(LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0))
    (root / "cat" / "2.jpg").unlink()
    (root / "cat" / "2.jpg").mkdir()
    with pytest.raises(DataferryError, match=r"cat/2\.jpg.*folder") as caught:
        ds[1]
    assert "Errno" not in str(caught.value)
