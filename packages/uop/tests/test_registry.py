"""The device registry: names, plugin discovery through entry points (in this process and, for real, from
distributions pip installs outside the repository), default selection, renderers, tensor cores and errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from uop_stand_ins import NamedRenderer, NullAllocator, NullCompiler, NullProgram

import lazygrad_uop
from lazygrad_uop.config import Context
from lazygrad_uop.device import CompiledDevice, Renderer, TensorCore
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.plugins import DeviceSpec, RendererSpec, TensorCoreSpec, hookimpl
from lazygrad_uop.registry import (
    Device,
    DeviceName,
    DeviceNameError,
    DeviceRegistry,
    DeviceUnavailableError,
    LazygradPluginWarning,
    PluginError,
    UnknownDeviceError,
    UnknownRendererError,
)

NO_ENTRY_POINTS = "lazygrad_tests_no_entry_points"


class FakePlugin:
    """A plugin providing one device, and optionally renderers and tensor cores for it."""

    def __init__(
        self,
        name: str,
        priority: int = 0,
        reason: str | None = None,
        renderers: tuple[RendererSpec, ...] = (),
        tensor_cores: tuple[TensorCoreSpec, ...] = (),
        package: str | None = None,
    ) -> None:
        self.name, self.priority, self.reason, self.package = name, priority, reason, package or f"pkg-{name.lower()}"
        self.renderer_specs, self.tc_specs = renderers, tensor_cores
        self.opened: list[str] = []
        self.usable_calls = 0

    def open(self, name: str) -> CompiledDevice:
        self.opened.append(name)
        return CompiledDevice(name, NullAllocator(), NamedRenderer("builtin"), NullCompiler(), NullProgram)

    def usable(self) -> str | None:
        self.usable_calls += 1
        return self.reason

    @hookimpl
    def lazygrad_devices(self) -> list[DeviceSpec]:
        return [DeviceSpec(self.name, self.open, self.usable, self.priority, self.package)]

    @hookimpl
    def lazygrad_renderers(self) -> list[RendererSpec]:
        return list(self.renderer_specs)

    @hookimpl
    def lazygrad_tensor_cores(self) -> list[TensorCoreSpec]:
        return list(self.tc_specs)


def registry_with(*plugins: object) -> DeviceRegistry:
    registry = DeviceRegistry(group=NO_ENTRY_POINTS)
    for plugin in plugins:
        registry.register_plugin(plugin)
    return registry


@pytest.fixture(autouse=True)
def no_dev():
    with Context(DEV=""):
        yield


# ---- names


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("cpu", DeviceName("CPU")),
        ("CPU:0", DeviceName("CPU")),
        (" cuda:1 ", DeviceName("CUDA", 1)),
        ("cuda:ptx", DeviceName("CUDA", 0, "PTX")),
        ("CUDA:2:PTX", DeviceName("CUDA", 2, "PTX")),
    ],
)
def test_parse(name: str, parsed: DeviceName) -> None:
    assert DeviceName.parse(name) == parsed


@pytest.mark.parametrize("name", ["", "CPU:", "CPU:1:2", "CPU:A:B", "CUDA:PTX:1", "1CPU", "CPU:-1", "MY-GPU"])
def test_parse_rejects_malformed_names(name: str) -> None:
    with pytest.raises(DeviceNameError, match="can't parse device name"):
        DeviceName.parse(name)


def test_canonicalize() -> None:
    assert [Device.canonicalize(n) for n in ("cpu", "cpu:0", "cpu:1", "cuda:1:ptx")] == [
        "CPU",
        "CPU",
        "CPU:1",
        "CUDA:1",
    ]


# ---- opening devices


def test_devices_open_once_per_canonical_name() -> None:
    plugin = FakePlugin("FAKE")
    registry = registry_with(plugin)
    assert registry.installed() == ["FAKE"]
    first = registry["fake"]
    assert registry["FAKE:0"] is first and registry["Fake"] is first
    second = registry["FAKE:1"]
    assert second is not first and second.device == "FAKE:1"
    assert plugin.opened == ["FAKE", "FAKE:1"]


def test_unknown_device_lists_installed_ones_and_names_the_package() -> None:
    registry = registry_with(FakePlugin("FAKE"), FakePlugin("OTHER"))
    with pytest.raises(UnknownDeviceError) as info:
        registry["cuda"]
    message = str(info.value)
    assert isinstance(info.value, KeyError)
    assert message == (
        "unknown device 'CUDA'; installed devices: FAKE, OTHER. "
        "CUDA is provided by the package lazygrad-runtime-cuda: `pip install lazygrad-runtime-cuda`."
    )
    with pytest.raises(UnknownDeviceError, match=r"^unknown device 'NOPE'; installed devices: FAKE, OTHER\.$"):
        registry["NOPE"]


@pytest.mark.parametrize(
    ("device", "package"),
    [
        ("CPU", "lazygrad-runtime-cpu"),
        ("AMD", "lazygrad-runtime-amd"),
        ("METAL", "lazygrad-runtime-metal"),
        ("PYTHON", "lazygrad-runtime-python"),
    ],
)
def test_well_known_devices_name_their_package(device: str, package: str) -> None:
    with pytest.raises(UnknownDeviceError, match=f"installed devices: none. {device} is provided by .*{package}"):
        registry_with()[device]


def test_unusable_device_says_why() -> None:
    plugin = FakePlugin("FAKE", reason="no fake hardware here")
    registry = registry_with(plugin)
    assert registry.usable("fake:1") == "no fake hardware here"
    with pytest.raises(
        DeviceUnavailableError, match=r"FAKE:1 \(from pkg-fake\) is installed .*: no fake hardware here"
    ):
        registry["FAKE:1"]
    assert plugin.opened == []
    assert plugin.usable_calls == 1


def test_crashing_usability_check_means_unusable() -> None:
    plugin = FakePlugin("FAKE")
    plugin.usable = lambda: 1 / 0  # type: ignore[method-assign]
    assert registry_with(plugin).usable("FAKE") == "its usability check raised ZeroDivisionError: division by zero"


def test_open_must_return_a_device() -> None:
    plugin = FakePlugin("FAKE")
    plugin.open = lambda name: "not a device"  # type: ignore[method-assign,assignment,return-value]
    with pytest.raises(PluginError, match="pkg-fake opened FAKE as str, not a CompiledDevice"):
        registry_with(plugin)["FAKE"]


def test_unregister_forgets_the_device() -> None:
    plugin = FakePlugin("FAKE")
    registry = registry_with(plugin)
    registry["FAKE"]
    registry.unregister_plugin(plugin)
    assert registry.installed() == []
    registry.register_plugin(plugin)
    registry["FAKE"]
    assert plugin.opened == ["FAKE", "FAKE"]


# ---- default device


def test_default_is_the_usable_device_of_highest_priority() -> None:
    registry = registry_with(
        FakePlugin("LOW", priority=1), FakePlugin("HIGH", priority=10, reason="absent"), FakePlugin("MID", priority=5)
    )
    assert registry.DEFAULT == "MID"


def test_dev_chooses_the_default() -> None:
    registry = registry_with(FakePlugin("LOW", priority=1), FakePlugin("MID", priority=5))
    with Context(DEV="low:1"):
        assert registry.DEFAULT == "LOW:1"
    with Context(DEV="CUDA"), pytest.raises(UnknownDeviceError, match="lazygrad-runtime-cuda"):
        _ = registry.DEFAULT
    with Context(DEV="LOW:1:2"), pytest.raises(DeviceNameError):
        _ = registry.DEFAULT


def test_dev_naming_an_unusable_device_fails() -> None:
    registry = registry_with(FakePlugin("GONE", reason="unplugged"), FakePlugin("HERE"))
    with Context(DEV="GONE"), pytest.raises(DeviceUnavailableError, match=r"DEV=GONE names .*: unplugged"):
        _ = registry.DEFAULT


def test_no_usable_device_lists_every_reason() -> None:
    registry = registry_with(FakePlugin("A", reason="no a"), FakePlugin("B", priority=3, reason="no b"))
    with pytest.raises(DeviceUnavailableError, match=r"B \(pkg-b\): no b; A \(pkg-a\): no a$"):
        _ = registry.DEFAULT
    with pytest.raises(DeviceUnavailableError, match="pip install lazygrad-runtime-cpu"):
        _ = registry_with().DEFAULT


# ---- renderers and tensor cores


def renderer_specs(device: str) -> tuple[RendererSpec, ...]:
    return (
        RendererSpec(device, "ALT", make=lambda: NamedRenderer("alt")),
        RendererSpec(device, "MAIN", make=lambda: NamedRenderer("main"), default=True),
    )


def test_renderers_default_first() -> None:
    registry = registry_with(FakePlugin("FAKE", renderers=renderer_specs("FAKE")))
    assert [r.name for r in registry.renderers("fake:1")] == ["MAIN", "ALT"]


def test_renderer_is_chosen_by_name_and_stays() -> None:
    registry = registry_with(FakePlugin("FAKE", renderers=renderer_specs("FAKE")))
    dev = registry["FAKE"]
    assert dev.renderer.render([]) == "builtin"
    # Naming the default renderer, which the device opened with, does not rebuild it.
    assert registry["FAKE:MAIN"].renderer.render([]) == "builtin"
    assert registry["fake:alt"] is dev and dev.renderer.render([]) == "alt"
    assert registry["FAKE"].renderer.render([]) == "alt"
    with pytest.raises(
        UnknownRendererError, match=r"device FAKE has no renderer 'PTX'; its renderers: MAIN \(default\), ALT"
    ):
        registry["FAKE:PTX"]


def test_dev_chooses_the_renderer() -> None:
    registry = registry_with(FakePlugin("FAKE", renderers=renderer_specs("FAKE")), FakePlugin("OTHER"))
    with Context(DEV="FAKE:1:ALT"):
        assert registry.DEFAULT == "FAKE:1"
        assert registry["FAKE"].renderer.render([]) == "alt"
        assert registry["OTHER"].renderer.render([]) == "builtin"


def test_renderers_may_come_from_another_plugin() -> None:
    class ExtraRenderer:
        @hookimpl
        def lazygrad_renderers(self) -> list[RendererSpec]:
            return [RendererSpec("FAKE", "EXTRA", make=lambda: NamedRenderer("extra"))]

    registry = registry_with(FakePlugin("FAKE"), ExtraRenderer())
    assert registry["FAKE:EXTRA"].renderer.render([]) == "extra"


def test_tensor_cores_by_target() -> None:
    def tc(dtype_in: Any) -> TensorCore:
        return TensorCore((8, 16, 16), 32, (8, 4, 4), dtype_in, dtypes.float, ("l0", "l1"))

    half, bf16 = tc(dtypes.half), tc(dtypes.bfloat16)
    specs = (TensorCoreSpec("FAKE", "v1", (half,)), TensorCoreSpec("FAKE", "v2", (half, bf16)))
    registry = registry_with(FakePlugin("FAKE", tensor_cores=specs))
    assert registry.tensor_cores("FAKE", "v1") == (half,)
    assert registry.tensor_cores("FAKE", "v2") == (half, bf16)
    assert registry.tensor_cores("fake") == (half, bf16)
    assert registry.tensor_cores("FAKE", "v3") == ()


# ---- misbehaving plugins


def test_plugin_whose_hook_raises_is_skipped_once() -> None:
    class Broken:
        @hookimpl
        def lazygrad_devices(self) -> list[DeviceSpec]:
            raise RuntimeError("driver exploded")

    registry = registry_with(FakePlugin("FAKE"), Broken())
    with pytest.warns(LazygradPluginWarning, match="lazygrad_devices hook raised RuntimeError: driver exploded") as rec:
        assert registry.installed() == ["FAKE"]
        assert registry.installed() == ["FAKE"]
    assert len(rec) == 1


def test_plugin_returning_the_wrong_type_is_skipped() -> None:
    class Wrong:
        @hookimpl
        def lazygrad_devices(self) -> list[str]:
            return ["CPU"]

    with pytest.warns(LazygradPluginWarning, match="returned \\['CPU'\\], not a list of DeviceSpec"):
        assert registry_with(Wrong(), FakePlugin("FAKE")).installed() == ["FAKE"]


def test_two_plugins_with_one_device_name() -> None:
    low, high = FakePlugin("FAKE", priority=1, package="low"), FakePlugin("FAKE", priority=2, package="high")
    registry = registry_with(low, high)
    with pytest.warns(LazygradPluginWarning, match="provided by both"):
        assert registry.spec("FAKE").package == "high"


# ---- entry points


def write_distribution(site: Path, dist: str, group: str, modules: dict[str, str]) -> None:
    """A minimal installed distribution: its modules and a dist-info with entry points in `group`."""
    for module, source in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    entries = "".join(f"{module.split('_')[0]} = {module}\n" for module in modules)
    (info / "entry_points.txt").write_text(f"[{group}]\n{entries}")


def test_entry_points_are_found_and_a_broken_one_warns_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tag = uuid.uuid4().hex[:8]
    group = f"lazygrad_tests_{tag}"
    good, broken = f"good_{tag}", f"broken_{tag}"
    good_source = """
        from lazygrad_uop.plugins import DeviceSpec, hookimpl

        @hookimpl
        def lazygrad_devices():
            return [DeviceSpec("EPDEV", open=None, usable=lambda: None, priority=0, package="ep-good")]
    """
    write_distribution(tmp_path, "ep-good", group, {good: good_source})
    write_distribution(tmp_path, "ep-broken", group, {broken: "raise ImportError('needs a driver this machine lacks')"})
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = DeviceRegistry(group=group)
    assert good not in sys.modules
    with pytest.warns(LazygradPluginWarning) as rec:
        assert registry.installed() == ["EPDEV"]
        assert registry.installed() == ["EPDEV"]
        assert registry.usable("EPDEV") is None
    assert [str(w.message) for w in rec] == [
        "lazygrad plugin 'broken' (ep-broken 1.0) failed to import and was skipped: needs a driver this machine lacks"
    ]
    assert good in sys.modules
    monkeypatch.delitem(sys.modules, good)


# ---- plugins installed with pip, outside the repository

GOOD_PLUGIN = """
    from lazygrad_uop.device import CompiledDevice, Compiler, LRUAllocator, Program, Renderer, TensorCore
    from lazygrad_uop.dtype import dtypes
    from lazygrad_uop.plugins import DeviceSpec, RendererSpec, TensorCoreSpec, hookimpl


    class Memory(LRUAllocator):
        def _alloc(self, size, options):
            return bytearray(size)

        def _free(self, handle, options):
            pass

        def _copyin(self, dest, src):
            dest[:] = src

        def _copyout(self, dest, src):
            dest[:] = src


    class TextRenderer(Renderer):
        device = "THROWAWAY"

        def render(self, uops):
            return "kernel"

        def tensor_core_problem(self, tc, target):
            return None


    class Identity(Compiler):
        def compile(self, src):
            return src.encode()


    class Noop(Program):
        def __call__(self, *bufs, global_size=(1, 1, 1), local_size=(1, 1, 1), vals=(), wait=False):
            return 0.0 if wait else None


    def open_device(name):
        return CompiledDevice(name, Memory(), TextRenderer(), Identity(None), Noop)


    @hookimpl
    def lazygrad_devices():
        return [DeviceSpec("THROWAWAY", open_device, lambda: None, 10**6, "lazygrad-throwaway-good")]


    @hookimpl
    def lazygrad_renderers():
        return [RendererSpec("THROWAWAY", "TEXT", TextRenderer, default=True)]


    @hookimpl
    def lazygrad_tensor_cores():
        tc = TensorCore((8, 8, 8), 32, (2, 2, 2), dtypes.half, dtypes.float, ("l0", "l1"))
        return [TensorCoreSpec("THROWAWAY", "t1", (tc,))]
"""

CHECK = """
    import json, sys, warnings
    from lazygrad_uop.dtype import dtypes
    from lazygrad_uop.registry import Device, LazygradPluginWarning

    before = "throwaway_good" in sys.modules
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        installed = Device.installed()
        default = Device.DEFAULT
        dev = Device["throwaway:text"]
        buf_bytes = dev.allocator.alloc(4)
        renderers = [r.name for r in Device.renderers("THROWAWAY")]
        tcs = [str(tc) for tc in Device.tensor_cores("THROWAWAY", "t1")]
        Device.installed()
    print(json.dumps({
        "imported_before_use": before,
        "installed": installed,
        "default": default,
        "device": dev.device,
        "alloc": len(buf_bytes),
        "renderers": renderers,
        "tensor_cores": tcs,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, LazygradPluginWarning)],
    }))
"""


def pip_available() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


def write_project(root: Path, dist: str, module: str, source: str) -> Path:
    root.mkdir()
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["hatchling"]
            build-backend = "hatchling.build"

            [project]
            name = "{dist}"
            version = "0.0.1"

            [project.entry-points.lazygrad]
            {module} = "{module}"

            [tool.hatch.build.targets.wheel]
            only-include = ["{module}.py"]
            """
        )
    )
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    return root


@pytest.mark.skipif(not pip_available(), reason="pip is not available to install the throwaway plugins")
def test_plugins_installed_with_pip_are_found_without_importing_them_by_name(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="the throwaway plugins are built with hatchling, a test dependency")
    good = write_project(tmp_path / "good", "lazygrad-throwaway-good", "throwaway_good", GOOD_PLUGIN)
    bad = write_project(
        tmp_path / "bad", "lazygrad-throwaway-bad", "throwaway_bad", "raise RuntimeError('broken on purpose')"
    )
    site = tmp_path / "site"
    # No build isolation: hatchling, a test dependency, builds the wheels without reaching any package index.
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation"]
    install = subprocess.run(
        [*pip, "--target", str(site), str(good), str(bad)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, f"pip could not install the throwaway plugins (is hatchling installed?):\n{install}"
    # The registry and pluggy come from this environment; the plugins only from the throwaway site directory.
    uop_root = Path(next(iter(lazygrad_uop.__path__))).parent
    env = {k: v for k, v in os.environ.items() if k not in ("DEV", "PYTHONPATH")}
    env |= {"PYTHONPATH": os.pathsep.join([str(site), str(uop_root)]), "CACHEDIR": str(tmp_path / "cache")}
    check = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHECK)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert check.returncode == 0, check.stderr
    result = json.loads(check.stdout)
    assert result["imported_before_use"] is False
    assert "THROWAWAY" in result["installed"]
    assert result["default"] == "THROWAWAY"
    assert (result["device"], result["alloc"]) == ("THROWAWAY", 4)
    assert result["renderers"] == ["TEXT"]
    assert result["tensor_cores"] == ["WMMA_8_8_8_half_float"]
    broken = [w for w in result["warnings"] if "throwaway_bad" in w]
    assert broken == [
        "lazygrad plugin 'throwaway_bad' (lazygrad-throwaway-bad 0.0.1) failed to import and was skipped: "
        "broken on purpose"
    ]
    assert not any(re.search("throwaway_good|THROWAWAY", w) for w in result["warnings"])


# ---- one route for tensor cores


class PickyRenderer(Renderer):
    """A renderer that emits only float16 tensor cores, and runs the descriptions of its target and older ones."""

    def __init__(self, targets: tuple[str, ...] = ("v2", "v1")) -> None:
        self.targets = targets

    def render(self, uops: list[Any]) -> str:
        return "picky"

    def tensor_core_targets(self) -> tuple[str, ...]:
        return self.targets

    def tensor_core_problem(self, tc: TensorCore, target: str) -> str | None:
        return None if tc.dtype_in == dtypes.half else f"no {tc.dtype_in} inputs"


def _tc(dtype_in: Any, k: int = 16) -> TensorCore:
    return TensorCore((8, 16, k), 32, (k * 16 // 32, k * 8 // 32, 4), dtype_in, dtypes.float)


class PickyPlugin(FakePlugin):
    def open(self, name: str) -> CompiledDevice:
        self.opened.append(name)
        return CompiledDevice(name, NullAllocator(), PickyRenderer(), NullCompiler(), NullProgram)


class TensorCoresOnly:
    """A plugin that only adds tensor-core descriptions for another plugin's device."""

    def __init__(self, *specs: TensorCoreSpec) -> None:
        self.specs = specs

    @hookimpl
    def lazygrad_tensor_cores(self) -> list[TensorCoreSpec]:
        return list(self.specs)


def _picky_registry(*extra: object) -> DeviceRegistry:
    renderer = RendererSpec("PICKY", "MAIN", make=PickyRenderer, default=True)
    builtin = TensorCoreSpec("PICKY", "v1", (_tc(dtypes.half),))
    return registry_with(PickyPlugin("PICKY", renderers=(renderer,), tensor_cores=(builtin,)), *extra)


def test_a_description_the_renderer_cannot_emit_is_rejected_with_a_warning_naming_the_plugin() -> None:
    bad = TensorCoresOnly(TensorCoreSpec("PICKY", "v2", (_tc(dtypes.bfloat16), _tc(dtypes.half, 8))))
    registry = _picky_registry()
    registry.register_plugin(bad, name="bad-tc-plugin")
    why = re.escape(f"'bad-tc-plugin': tensor core {_tc(dtypes.bfloat16)} for PICKY v2 was rejected: no ")
    with pytest.warns(LazygradPluginWarning, match=why):
        kept = registry.tensor_cores("PICKY", "v2")
    # the emittable description of the same plugin stays
    assert kept == (_tc(dtypes.half, 8),)


def test_newer_target_additions_keep_the_older_targets_descriptions() -> None:
    added = TensorCoresOnly(TensorCoreSpec("PICKY", "v2", (_tc(dtypes.half, 8),)))
    registry = _picky_registry(added)
    # the device opened through the registry gets v2's addition and v1's built-in, its own target first
    renderer = registry["PICKY"].renderer
    assert renderer.tensor_cores == (_tc(dtypes.half, 8), _tc(dtypes.half))
    # a renderer for v1 only gets v1's
    assert registry.tensor_cores_for("PICKY", PickyRenderer(("v1",))) == (_tc(dtypes.half),)


def test_descriptions_reach_a_renderer_chosen_by_name() -> None:
    alt = RendererSpec("PICKY", "ALT", make=lambda: PickyRenderer(("v1",)))
    registry = _picky_registry(TensorCoresOnly(), FakePlugin("UNRELATED"))
    registry.register_plugin(type("AltRenderer", (), {"lazygrad_renderers": hookimpl(lambda self: [alt])})())
    assert registry["PICKY:ALT"].renderer.tensor_cores == (_tc(dtypes.half),)


def test_a_renderer_spec_brings_its_compiler() -> None:
    class OtherCompiler(NullCompiler):
        pass

    spec = RendererSpec("FAKE", "OWN", make=lambda: NamedRenderer("own"), compiler=OtherCompiler)
    registry = registry_with(FakePlugin("FAKE", renderers=(spec, *renderer_specs("FAKE"))))
    plain = registry["FAKE"]
    assert type(plain.compiler) is NullCompiler
    assert registry["FAKE:OWN"].renderer.render([]) == "own" and type(plain.compiler) is OtherCompiler
    # a renderer that brings no compiler compiles with the device's own again
    assert registry["FAKE:MAIN"].renderer.render([]) == "main" and type(plain.compiler) is NullCompiler


def test_select_switches_the_renderer_as_dev_does() -> None:
    registry = registry_with(FakePlugin("FAKE", renderers=renderer_specs("FAKE")))
    assert registry.select("fake:alt") == "FAKE"
    assert registry["FAKE"].renderer.render([]) == "alt"
    assert registry.select("FAKE") == "FAKE" and registry["FAKE"].renderer.render([]) == "alt"
