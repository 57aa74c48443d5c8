"""What the commands share: file names from agent names, the network check before anything."""

from __future__ import annotations

import pytest

from commgym.env.net import NetworkPlan, host
from commgym.experiments.session import check_network, slug


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ppo (learned)", "ppo_learned"),
        ("static:int8/4MB/H1", "static_int8_4MB_H1"),
        ("static:ddp-default", "static_ddp-default"),
        ("static:topk:0.01/25MB/H4", "static_topk_0.01_25MB_H4"),
        ("policy (policy.zip)", "policy_policy.zip"),
        ("oracle-static[int8/1MB/H4] (oracle)", "oracle-static_int8_1MB_H4_oracle"),
    ],
)
def test_slug_gives_clean_file_names(name, expected):
    assert slug(name) == expected


def _host(monkeypatch, ok: bool, netem: bool) -> None:
    features = host.HostFeatures(ok, "ok" if ok else "needs root", netem, "no sch_netem here")
    monkeypatch.setattr(host, "probe_host", lambda: features)


def test_network_check_names_the_flag_that_fixes_it(monkeypatch):
    check_network(NetworkPlan.parse(None))  # loopback: nothing to check
    _host(monkeypatch, ok=True, netem=False)
    check_network(NetworkPlan.parse("5gbit"))  # rate only: tbf is enough
    with pytest.raises(ValueError, match=r"5gbit:10ms.*--drop-impairments"):
        check_network(NetworkPlan.parse("5gbit:10ms"))
    check_network(NetworkPlan.parse("5gbit:10ms"), strict=False)  # dropped with a warning
    with pytest.raises(ValueError, match=r"scenario .x.*100mbit:10ms"):
        check_network(NetworkPlan.parse({"profiles": ["1gbit", "wan-100m"]}), True, "scenario 'x'")
    _host(monkeypatch, ok=False, netem=False)
    with pytest.raises(ValueError, match=r"unavailable here: needs root.*loopback"):
        check_network(NetworkPlan.parse("100mbit"))
    _host(monkeypatch, ok=True, netem=True)
    check_network(NetworkPlan.parse("5gbit:10ms"))  # this kernel has sch_netem
