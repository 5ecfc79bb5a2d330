"""The google-cloud-storage client against the lab: listing, byte-exact downloads, checksums."""

import google_crc32c
import pytest
from google.api_core.exceptions import NotFound

from dataferry.course.lab import BucketNotFound, plan_dataset
from dataferry.course.lab.datasets import crc32c_b64


def test_client_lists_and_downloads_byte_exact_with_crc32c(lab, lab_bucket, tmp_path):
    ds = plan_dataset(12, 300_000, prefix="train", seed=7, shard_bytes=None).upload(lab_bucket)
    client = lab.client()  # through toxiproxy, as a user's code would connect
    listed = {b.name: b for b in client.list_blobs(lab_bucket.name, prefix="train/files/")}
    assert sorted(listed) == sorted(ds.object_names)
    for name in ds.object_names:
        expected = ds.content(name)
        blob = listed[name]
        assert blob.size == len(expected)
        # The server's checksum is the one the client verifies against: it must be right.
        assert blob.crc32c == crc32c_b64(expected)
        assert blob.generation
        assert client.bucket(lab_bucket.name).blob(name).download_as_bytes(checksum="crc32c") == expected
    target = tmp_path / "one.bin"
    client.bucket(lab_bucket.name).blob(ds.object_names[0]).download_to_filename(target, checksum="crc32c")
    assert google_crc32c.value(target.read_bytes()) == google_crc32c.value(ds.content(ds.object_names[0]))


def test_paged_listing_returns_everything_once(lab, lab_bucket):
    ds = plan_dataset(45, 10, seed=1, shard_bytes=None).upload(lab_bucket)
    pages = lab.client().list_blobs(lab_bucket.name, prefix="data/files/", max_results=None, page_size=10).pages
    names = [b.name for page in pages for b in page]
    assert sorted(names) == sorted(ds.object_names)


def test_overwrite_gives_new_generation_and_bytes(lab, lab_bucket):
    blob = lab.client().bucket(lab_bucket.name).blob("x.bin")
    blob.upload_from_string(b"first")
    blob.reload()
    first_gen = blob.generation
    blob.upload_from_string(b"second version")
    blob.reload()
    assert blob.generation != first_gen
    assert blob.download_as_bytes(checksum="crc32c") == b"second version"


def test_missing_bucket_gives_bucket_not_found_naming_it(lab):
    with pytest.raises(BucketNotFound, match=r"lab bucket 'no-such-bucket' does not exist"):
        lab.bucket("no-such-bucket")
    with pytest.raises(NotFound):  # the plain client says 404, as real GCS does
        list(lab.client().list_blobs("no-such-bucket"))


def test_missing_object_is_404(lab, lab_bucket):
    with pytest.raises(NotFound):
        lab.client().bucket(lab_bucket.name).blob("nope").download_as_bytes()
