"""The tenant keeps an auditor who can actually read its audit log: an enabled user or service
in role:auditor with a working credential carrying `read:audit` (an enabled admin client, or
an approved mapping to a trusted IdP). A role holder without one — an agent, a user with no
client, a user whose clients lack `read:audit` or are disabled — does not count, the way it
does not count for the last policy admin (before: any enabled role holder counted, so the last
real auditor could drop the role and leave the log unreadable)."""

from __future__ import annotations

import pytest

from tests.fixtures.api import Api
from tests.integration.identity.test_last_admin_client import EVERY_ADMIN_SCOPE, _admin
from tests.integration.memory.support import assert_problem

AUDIT = "/v1/audit/events"


async def _auditor_without_credentials(api: Api, clients: str) -> str:
    principal = await api.new_principal("bob")
    if clients == "policy-only":
        await api.new_client(principal["id"], ["manage:policy"], kind="admin")
    elif clients == "agent-only":
        await api.new_client(principal["id"], ["read:memory"], kind="agent")
    granted = await api.http.put(
        f"/v1/principals/{principal['id']}/roles/auditor", headers=api.admin.headers
    )
    assert granted.status_code == 200, granted.text
    return str(principal["id"])


@pytest.mark.parametrize("clients", ["none", "policy-only", "agent-only"])
async def test_a_role_holder_who_cannot_read_the_log_does_not_keep_it_readable(
    api: Api, clients: str
) -> None:
    await _auditor_without_credentials(api, clients)
    owner = api.admin.principal_id
    refused = await api.http.delete(
        f"/v1/principals/{owner}/roles/auditor", headers=api.admin.headers
    )
    body = assert_problem(refused, 409, "last-role-holder")
    assert "read:audit" in body["detail"]
    # Unchanged: the owner still reads the log.
    assert (await api.http.get(AUDIT, headers=api.admin.headers)).status_code == 200


async def test_disabling_the_last_working_auditors_client_is_refused(api: Api) -> None:
    """A second full admin (not an auditor) may not disable the only client through which the
    tenant's only auditor reads the log."""
    _, _, _, deputy = await _admin(api, "deputy")
    refused = await api.http.post(f"/v1/clients/{api.admin.client_id}/disable", headers=deputy)
    body = assert_problem(refused, 409, "last-role-holder")
    assert "auditor" in body["detail"]
    assert api.admin.client_id in body["detail"]
    assert (await api.http.get(AUDIT, headers=api.admin.headers)).status_code == 200


async def test_a_working_second_auditor_lets_the_first_one_go(api: Api) -> None:
    principal = await api.new_principal("carol")
    created = await api.new_client(principal["id"], EVERY_ADMIN_SCOPE, kind="admin")
    granted = await api.http.put(
        f"/v1/principals/{principal['id']}/roles/auditor", headers=api.admin.headers
    )
    assert granted.status_code == 200, granted.text
    owner = api.admin.principal_id
    gone = await api.http.delete(f"/v1/principals/{owner}/roles/auditor", headers=api.admin.headers)
    assert gone.status_code == 204, gone.text
    carol = await api.access_token(created["client"]["client_id"], created["client_secret"])
    read = await api.http.get(AUDIT, headers={"Authorization": f"Bearer {carol}"})
    assert read.status_code == 200, read.text
