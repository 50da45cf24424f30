"""Path parameter parsing with problems a model can act on."""

from __future__ import annotations

import uuid

from service.problems import MalformedId


def parse_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise MalformedId(
            f"'{raw[:64]}' is not a UUID. Ids look like 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b."
        ) from None
