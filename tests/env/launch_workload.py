"""A workload module for the launch-config tests: ranks know ``launch-probe`` only by importing it.

``launch-probe`` is the digits MLP under another name, so a rank can build it only when
the launch config's ``workload_modules`` reached it and was imported there.
"""

from __future__ import annotations

import dataclasses

from commgym.env.workloads import get_workload, register_workload

NAME = "launch-probe"


def _factory():
    return dataclasses.replace(get_workload("mlp-digits"), name=NAME)


register_workload(NAME, _factory, overwrite=True)
