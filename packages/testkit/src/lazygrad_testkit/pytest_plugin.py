"""The testkit's pytest plugin (registered through the `pytest11` entry point, so it is active wherever the testkit
is installed): the `--lazygrad-device` option and the fixtures of the conformance suite.

    pytest --pyargs lazygrad_testkit --lazygrad-device=MYDEV       # the conformance suite on a plugin's device
    pytest --pyargs lazygrad_testkit                                # on every in-tree device usable here

    pytest --pyargs lazygrad_testkit --lazygrad-device=MYDEV --lazygrad-skip-dtype=bfloat16   # MYDEV lacks bf16

Fixtures: `lazygrad_device` (each device under test, skipped where it can't run here), `lazygrad_skip_dtypes`,
`lazygrad_registry` (a factory of isolated registries, `isolated_registry`), `lazygrad_stand_in` (`stand_in`).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lazygrad_testkit.registry import isolated_registry, stand_in
from lazygrad_uop.dtype import DType

# the devices the suite runs on when no --lazygrad-device is given: lazygrad's own, where they are usable
IN_TREE_DEVICES = ("CPU", "PYTHON", "CL", "CUDA", "HIP", "AMD", "METAL")


def pytest_addoption(parser: pytest.Parser) -> None:
    """--lazygrad-device NAME (repeatable): the devices the conformance suite checks."""
    parser.addoption(
        "--lazygrad-device",
        action="append",
        default=[],
        metavar="NAME",
        help="a lazygrad device (e.g. MYDEV or CPU:C) to run the conformance suite on; repeatable. Default: every "
        "in-tree device usable here",
    )
    parser.addoption(
        "--lazygrad-skip-dtype",
        action="append",
        default=[],
        metavar="DTYPE",
        help="a dtype (e.g. bfloat16) the devices under test don't have: op-suite cases whose graph uses it are "
        "skipped, saying so; repeatable",
    )


def devices_under_test(config: pytest.Config) -> list[str]:
    """The devices named with --lazygrad-device, else lazygrad's own."""
    return list(config.getoption("--lazygrad-device")) or list(IN_TREE_DEVICES)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise every test that takes `lazygrad_device` by the devices under test."""
    if "lazygrad_device" in metafunc.fixturenames:
        metafunc.parametrize("lazygrad_device", devices_under_test(metafunc.config), indirect=True, scope="session")


@pytest.fixture(scope="session")
def lazygrad_device(request: pytest.FixtureRequest) -> str:
    """The name of a device under test; the test skips, saying why, where it is not installed or not usable, and
    fails if it was named explicitly with --lazygrad-device and is not installed (a typo must not pass)."""
    from lazygrad_uop.registry import Device, UnknownDeviceError

    name = request.param
    try:
        why = Device.usable(name)
    except UnknownDeviceError as exc:
        if request.config.getoption("--lazygrad-device"):
            raise
        pytest.skip(str(exc))
    if why is not None:
        pytest.skip(f"{name} is not usable here: {why}")
    return name


@pytest.fixture(scope="session")
def lazygrad_skip_dtypes(request: pytest.FixtureRequest) -> frozenset[DType]:
    """The dtypes named with --lazygrad-skip-dtype; an unknown name fails, listing the dtypes there are."""
    from lazygrad_uop.dtype import dtypes

    known = {dt.name: dt for dt in vars(dtypes).values() if isinstance(dt, DType)}
    known |= {name: dt for name, dt in vars(dtypes).items() if isinstance(dt, DType)}
    names = request.config.getoption("--lazygrad-skip-dtype")
    if unknown := [n for n in names if n not in known]:
        raise pytest.UsageError(f"--lazygrad-skip-dtype {unknown}: not dtypes; dtypes are {sorted(known)}")
    return frozenset(known[n] for n in names)


@pytest.fixture
def lazygrad_registry() -> Callable[..., object]:
    """`lazygrad_registry(*plugins)`: a registry that sees only `plugins` (see `isolated_registry`)."""
    return isolated_registry


@pytest.fixture
def lazygrad_stand_in() -> Callable[[str], object]:
    """`with lazygrad_stand_in("CUDA"):` the device is usable in the process's registry (see `stand_in`)."""
    return stand_in
