"""Run records read alike whether they were kept plain or gzip-compressed."""

from __future__ import annotations

import gzip

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specactor.compressed import read_text


@settings(max_examples=50, deadline=None)
@given(text=st.text())
def test_a_compressed_file_reads_as_its_plain_text(tmp_path_factory, text: str) -> None:
    folder = tmp_path_factory.mktemp("records")
    plain, packed = folder / "r.jsonl", folder / "r.jsonl.gz"
    plain.write_bytes(text.encode("utf-8"))
    packed.write_bytes(gzip.compress(text.encode("utf-8")))
    assert read_text(plain) == read_text(packed) == text


def test_the_name_does_not_decide(tmp_path) -> None:
    """A compressed file without .gz in its name is still read (and a plain one named .gz)."""
    (tmp_path / "a.jsonl").write_bytes(gzip.compress(b'{"x": 1}\n'))
    (tmp_path / "b.jsonl.gz").write_text('{"x": 2}\n')
    assert read_text(tmp_path / "a.jsonl") == '{"x": 1}\n'
    assert read_text(tmp_path / "b.jsonl.gz") == '{"x": 2}\n'


def test_a_cut_off_compressed_file_is_an_error_naming_it(tmp_path) -> None:
    data = gzip.compress(("line\n" * 1000).encode())
    (tmp_path / "cut.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut.gz: compressed file damaged"):
        read_text(tmp_path / "cut.gz")


def test_a_file_that_is_not_text_is_an_error_naming_it(tmp_path) -> None:
    (tmp_path / "model.bin").write_bytes(b"\x00\xff\xfe binary")
    with pytest.raises(ValueError, match=r"model.bin: not UTF-8 text"):
        read_text(tmp_path / "model.bin")
