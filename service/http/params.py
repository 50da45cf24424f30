"""Path parameter parsing with problems a model can act on."""

from __future__ import annotations

import uuid
from typing import Annotated, TypeAlias

from litestar.params import PathParameter

from service.problems import MalformedId

PathId: TypeAlias = Annotated[str, PathParameter(format="uuid")]
"""An id in the path: documented as a UUID, read as text so that `parse_id` answers a malformed
one with the `malformed-id` problem (a typed parameter would answer Litestar's own 400)."""


def parse_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise MalformedId(
            f"'{raw[:64]}' is not a UUID. Ids look like 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b."
        ) from None
