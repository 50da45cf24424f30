from __future__ import annotations

import uuid

import pytest

from service.db.base import uuid7
from service.memory.normalize import content_hash
from service.memory.service import decode_cursor, encode_cursor
from service.problems import BadCursor


def test_uuid7_is_version_7_and_strictly_increasing() -> None:
    ids = [uuid7() for _ in range(10_000)]  # many share a millisecond
    assert all(value.version == 7 and value.variant == uuid.RFC_4122 for value in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert len({value.int >> 80 for value in ids}) < len(ids)


def test_content_hash_ignores_case_spacing_and_unicode_form() -> None:
    assert content_hash("Deploy  window is\nFRIDAY") == content_hash("deploy window is friday")
    assert content_hash("ﬁle") == content_hash("file")
    assert content_hash("deploy on friday") != content_hash("deploy on monday")


def test_cursor_round_trip_and_refusal() -> None:
    last = uuid7()
    assert decode_cursor(encode_cursor(last)) == last
    for bad in ("", "garbage!!", "eyJ2IjoyfQ", encode_cursor(last)[:-4]):
        with pytest.raises(BadCursor):
            decode_cursor(bad)
