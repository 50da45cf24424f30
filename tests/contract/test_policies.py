"""policies/: the model loads in pycasbin and is the allow-only RBAC-with-domains model the
compiler implements (no key-match functions); the seed policy holds only typed, exact names and
grants the bootstrap admin the policy admin and auditor roles."""

from __future__ import annotations

from pathlib import Path

import casbin
import pytest

from service.policy.rules import AUDITOR, POLICY_ADMIN, Rule
from service.policy.seed import POLICIES_DIR, bootstrap_rules


def test_the_model_loads_and_uses_no_key_match() -> None:
    lines = (POLICIES_DIR / "memgate_model.conf").read_text().splitlines()
    model = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    assert "keyMatch" not in model
    assert "regexMatch" not in model
    assert "e = some(where (p.eft == allow))" in model
    enforcer = casbin.Enforcer(str(POLICIES_DIR / "memgate_model.conf"))
    enforcer.add_policy("user:a", "t", "space:s", "read")
    enforcer.add_named_grouping_policy("g2", "space:child", "space:s", "t")
    assert enforcer.enforce("user:a", "t", "space:child", "read")
    assert not enforcer.enforce("user:a", "other", "space:child", "read")


def test_the_seed_makes_the_admin_a_policy_admin_and_the_first_auditor() -> None:
    admin = "user:00000000-0000-0000-0000-000000000001"
    assert bootstrap_rules(admin) == [Rule("g", admin, POLICY_ADMIN), Rule("g", admin, AUDITOR)]


@pytest.mark.parametrize(
    "line", ["g, {admin}, role:*", "p, {admin}, space:x, read", "g, {admin}", "x, a, b"]
)
def test_a_seed_with_untyped_names_or_bad_shape_is_refused(tmp_path: Path, line: str) -> None:
    seed = tmp_path / "seed.csv"
    seed.write_text(line + "\n")
    with pytest.raises(ValueError, match="seed"):
        bootstrap_rules("user:00000000-0000-0000-0000-000000000001", seed)
