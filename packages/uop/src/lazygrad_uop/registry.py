"""The device registry: finds plugins through the `lazygrad` entry-point group and opens devices by name.

    from lazygrad_uop.registry import Device
    Device["CPU"]        # the first CPU device, opened once and kept
    Device["cuda:1"]     # names are case-insensitive; "CUDA:0" is "CUDA"
    Device["CUDA:PTX"]   # the CUDA device, rendering with the renderer named PTX
    Device.DEFAULT       # DEV if set, else the highest-priority usable device

Nothing is imported until the registry is first asked a question, and a plugin that fails to import is reported
once with a `LazygradPluginWarning` and skipped, so one broken plugin never hides the others. The same holds for a
device that says it is usable but fails to open: when choosing the default, it is skipped with a warning naming its
package and the next usable device is chosen. A hook implementation whose name matches no hook of
`lazygrad_uop.plugins.LazygradSpec` (a misspelling) is reported with a warning; `register_plugin` rejects an object
that implements no hook at all (`PluginRegistrationError`) and leaves the registry as it was.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.metadata
import inspect
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pluggy

from lazygrad_uop.config import DEV
from lazygrad_uop.device import CompiledDevice, Renderer, TensorCore
from lazygrad_uop.plugins import NAME_PATTERN, PROJECT, DeviceSpec, LazygradSpec, RendererSpec, TensorCoreSpec

# The distribution that provides each device lazygrad's authors ship, for "install this" hints.
WELL_KNOWN_DEVICES = {
    "CPU": "lazygrad-runtime-cpu",
    "CUDA": "lazygrad-runtime-cuda",
    "AMD": "lazygrad-runtime-amd",
    "METAL": "lazygrad-runtime-metal",
    "PYTHON": "lazygrad-runtime-python",
}


class LazygradPluginWarning(UserWarning):
    """A plugin failed (to import, or in one of its hooks) and was skipped; the other plugins still work."""


class DeviceNameError(ValueError):
    """A device name that can't be parsed: it must be NAME, NAME:INDEX, NAME:RENDERER or NAME:INDEX:RENDERER."""


class UnknownDeviceError(KeyError):
    """No installed plugin provides the device (or the renderer) asked for."""

    def __str__(self) -> str:
        # KeyError would show the message quoted, as if it were a key.
        return str(self.args[0]) if self.args else ""


class UnknownRendererError(UnknownDeviceError):
    """The device exists but no installed plugin offers a renderer of that name for it."""


class DeviceUnavailableError(RuntimeError):
    """The device is installed but can't be used on this machine (no driver, no hardware, wrong OS)."""


class PluginError(RuntimeError):
    """A plugin broke its contract while opening a device (e.g. returned something that is not a device)."""


class PluginRegistrationError(TypeError):
    """`register_plugin` was given something that is not a plugin: not a module or object with `@hookimpl`
    functions named after lazygrad's hooks. The registry is left as it was."""


@dataclass(frozen=True)
class DeviceInfo:
    """One installed device as `Device.list()` describes it.

    usable: None when it runs here, else why not. renderers: (name, is the default) pairs, the default first.
    tensor_cores: per target architecture, the tensor cores the plugins describe for it.
    """

    name: str
    package: str
    version: str | None  # the package's installed version; None when it is not an installed distribution
    priority: int
    usable: str | None
    default: bool
    renderers: tuple[tuple[str, bool], ...]
    tensor_cores: dict[str, tuple[TensorCore, ...]]


@dataclass(frozen=True)
class DeviceName:
    """A parsed device name: "cuda:1:ptx" is base CUDA, index 1, renderer PTX."""

    base: str
    index: int = 0
    renderer: str | None = None

    @property
    def canonical(self) -> str:
        """The name a device is known by: "CUDA" for index 0, "CUDA:1" otherwise. The renderer is not part of it,
        since it doesn't change which memory buffers live in."""
        return self.base if self.index == 0 else f"{self.base}:{self.index}"

    @staticmethod
    def parse(name: str) -> DeviceName:
        """Parse NAME, NAME:INDEX, NAME:RENDERER or NAME:INDEX:RENDERER, case-insensitively."""
        if not isinstance(name, str):
            raise DeviceNameError(f"a device name is a string like 'CPU' or 'CUDA:1', got {name!r}")
        base, *rest = name.strip().upper().split(":")
        index: int | None = None
        renderer: str | None = None
        for part in rest:
            if part.isdigit() and index is None and renderer is None:
                index = int(part)
            elif NAME_PATTERN.fullmatch(part) and renderer is None:
                renderer = part
            else:
                raise DeviceNameError(
                    f"can't parse device name {name!r}: expected NAME, NAME:INDEX, NAME:RENDERER or "
                    "NAME:INDEX:RENDERER (e.g. 'CUDA', 'CUDA:1', 'CUDA:PTX')"
                )
        if not NAME_PATTERN.fullmatch(base):
            raise DeviceNameError(f"can't parse device name {name!r}: the device part must be a name like 'CUDA'")
        return DeviceName(base, index or 0, renderer)


@dataclass(frozen=True)
class _Catalog:
    """Everything the registered plugins provide, gathered once per change of the plugin set."""

    devices: dict[str, tuple[DeviceSpec, object]]  # name -> (spec, the plugin that provided it)
    renderers: tuple[RendererSpec, ...]
    tensor_cores: tuple[tuple[TensorCoreSpec, str], ...]  # (spec, the name of the plugin that registered it)
    # per device: the entries its default renderer can emit, checked on the first question about the device's tensor
    # cores (checking needs the renderer, whose module a process that never uses the device shouldn't import)
    emittable: dict[str, tuple[tuple[TensorCoreSpec, str], ...]] = field(default_factory=dict)


_HOOKS = (
    ("lazygrad_devices", DeviceSpec),
    ("lazygrad_renderers", RendererSpec),
    ("lazygrad_tensor_cores", TensorCoreSpec),
)
_SPEC_NAMES = tuple(hook for hook, _ in _HOOKS)


def _describe(plugin: object) -> str:
    text = repr(plugin)
    return f"{type(plugin).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


class DeviceRegistry:
    """The devices, renderers and tensor cores that plugins provide, and the devices opened so far.

    Plugins come from the entry-point group `group` (read on first use) and from `register_plugin`.
    """

    def __init__(self, group: str = PROJECT) -> None:
        self.group = group
        self._pm = pluggy.PluginManager(PROJECT)
        self._pm.add_hookspecs(LazygradSpec)
        self._lock = threading.RLock()
        self._entry_points_loaded = False
        self._catalog: _Catalog | None = None
        self._usable: dict[str, str | None] = {}
        self._default: tuple[str, _Catalog, str] | None = None
        self._opened: dict[str, CompiledDevice] = {}
        self._renderer_in_use: dict[str, str] = {}
        # tensor cores already reported as not emittable, so that each is reported once
        self._rejected: set[tuple[str, TensorCore]] = set()

    # ---- plugins

    def register_plugin(self, plugin: object, name: str | None = None) -> None:
        """Register a module or object that implements lazygrad hooks, as if an entry point had named it.

        Raises `PluginRegistrationError` (and registers nothing) for anything else: a class rather than an instance,
        an object without any `@hookimpl` function, one already registered, or a hook whose signature doesn't match
        its spec. A hook implementation whose name matches no spec is registered with a warning."""
        with self._lock:
            self._load_entry_points()
            self._check_plugin(plugin, name)
            try:
                registered = self._pm.register(plugin, name=name)
            except (ValueError, pluggy.PluginValidationError) as exc:
                raise PluginRegistrationError(
                    f"can't register {_describe(plugin)} as a lazygrad plugin: {exc}"
                ) from exc
            self._warn_unknown_hooks(plugin, registered or name or _describe(plugin), stacklevel=4)
            self._catalog = None

    def _hook_names(self, plugin: object) -> list[str]:
        """The hooks `plugin` implements with `@hookimpl`, by the name of the spec each is meant for."""
        names = []
        for attr in dir(plugin):
            try:
                opts = self._pm.parse_hookimpl_opts(plugin, attr)
            except Exception:  # noqa: BLE001 - an attribute that can't be read is not a hook
                continue
            if opts is not None:
                names.append(opts.get("specname") or attr)
        return names

    def _check_plugin(self, plugin: object, name: str | None) -> None:
        what = _describe(plugin)
        if isinstance(plugin, type):
            # a class works as a namespace of static hooks; its instance methods would be called without an instance
            unbound = [
                attr
                for attr in self._hook_names(plugin)
                if not isinstance(inspect.getattr_static(plugin, attr, None), (staticmethod, classmethod))
            ]
            if unbound:
                raise PluginRegistrationError(
                    f"can't register {what} as a lazygrad plugin: it is a class whose hooks {', '.join(unbound)} are "
                    "instance methods; register an instance of it (or a module)"
                )
        if not self._hook_names(plugin):
            raise PluginRegistrationError(
                f"can't register {what} as a lazygrad plugin: it implements none of lazygrad's hooks "
                f"({', '.join(_SPEC_NAMES)}); a plugin is a module (or object) whose hook functions are decorated "
                "with lazygrad_uop.plugins.hookimpl"
            )
        if self._pm.is_registered(plugin) or (name is not None and self._pm.has_plugin(name)):
            raise PluginRegistrationError(f"can't register {what} as a lazygrad plugin: it is already registered")

    def _warn_unknown_hooks(self, plugin: object, name: str, stacklevel: int) -> None:
        for hook in self._hook_names(plugin):
            if hook in _SPEC_NAMES:
                continue
            close = difflib.get_close_matches(hook, _SPEC_NAMES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; the hooks are {', '.join(_SPEC_NAMES)}"
            warnings.warn(
                f"lazygrad plugin {name!r} implements {hook!r}, which is not a lazygrad hook, so it is never "
                f"called{hint}",
                LazygradPluginWarning,
                stacklevel=stacklevel,
            )

    def unregister_plugin(self, plugin: object) -> None:
        """Remove a plugin and forget the devices opened through it."""
        with self._lock:
            self._pm.unregister(plugin)
            self._forget(plugin)

    def _forget(self, plugin: object) -> None:
        if self._catalog is not None:
            gone = {name for name, (_, owner) in self._catalog.devices.items() if owner is plugin}
            for canonical in [c for c in self._opened if DeviceName.parse(c).base in gone]:
                del self._opened[canonical]
                self._renderer_in_use.pop(canonical, None)
        self._catalog = None

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in importlib.metadata.entry_points(group=self.group):
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown distribution"
            try:
                module = ep.load()
            except Exception as exc:  # noqa: BLE001 - a plugin may fail in any way; it must not take the others down
                warnings.warn(
                    f"lazygrad plugin {ep.name!r} ({dist}) failed to import and was skipped: {exc}",
                    LazygradPluginWarning,
                    stacklevel=4,
                )
                continue
            if self._pm.is_registered(module):
                continue
            name = f"{ep.name} ({dist})"
            if not self._hook_names(module):
                warnings.warn(
                    f"lazygrad plugin {name!r} was skipped: its module {module.__name__!r} implements none of "
                    f"lazygrad's hooks ({', '.join(_SPEC_NAMES)}) with lazygrad_uop.plugins.hookimpl",
                    LazygradPluginWarning,
                    stacklevel=4,
                )
                continue
            try:
                self._pm.register(module, name=name)
            except (ValueError, pluggy.PluginValidationError) as exc:
                warnings.warn(f"lazygrad plugin {name!r} was skipped: {exc}", LazygradPluginWarning, stacklevel=4)
                continue
            self._warn_unknown_hooks(module, name, stacklevel=5)

    def _skip_plugin(self, plugin: object, why: str) -> None:
        name = self._pm.get_name(plugin)
        warnings.warn(f"lazygrad plugin {name!r} was skipped: {why}", LazygradPluginWarning, stacklevel=5)
        self._pm.unregister(plugin)

    def _gather(self) -> _Catalog:
        with self._lock:
            if self._catalog is not None:
                return self._catalog
            self._load_entry_points()
            gathered: dict[str, list[tuple[object, Any]]] = {}
            failed: dict[object, str] = {}
            for hook, kind in _HOOKS:
                gathered[hook] = []
                for impl in getattr(self._pm.hook, hook).get_hookimpls():
                    if impl.plugin in failed:
                        continue
                    try:
                        items = impl.function()
                    except Exception as exc:  # noqa: BLE001 - isolate plugins from each other, as on import
                        failed[impl.plugin] = f"its {hook} hook raised {type(exc).__name__}: {exc}"
                        continue
                    if not isinstance(items, (list, tuple)) or not all(isinstance(x, kind) for x in items):
                        failed[impl.plugin] = f"its {hook} hook returned {items!r}, not a list of {kind.__name__}"
                        continue
                    gathered[hook].extend((impl.plugin, x) for x in items)
            for plugin, why in failed.items():
                self._skip_plugin(plugin, why)
            devices: dict[str, tuple[DeviceSpec, object]] = {}
            for plugin, spec in gathered["lazygrad_devices"]:
                if plugin in failed:
                    continue
                if (seen := devices.get(spec.name)) is not None:
                    keep = spec if spec.priority > seen[0].priority else seen[0]
                    warnings.warn(
                        f"device {spec.name} is provided by both {seen[0].package} and {spec.package}; "
                        f"using the one from {keep.package} (higher priority, or found first)",
                        LazygradPluginWarning,
                        stacklevel=4,
                    )
                    if keep is seen[0]:
                        continue
                devices[spec.name] = (spec, plugin)
            renderers = tuple(spec for plugin, spec in gathered["lazygrad_renderers"] if plugin not in failed)
            tensor_cores = [
                (spec, str(self._pm.get_name(plugin)))
                for plugin, spec in gathered["lazygrad_tensor_cores"]
                if plugin not in failed
            ]
            self._catalog = _Catalog(devices, renderers, tuple(tensor_cores))
            self._usable.clear()
            return self._catalog

    def _tensor_core_entries(self, base: str) -> tuple[tuple[TensorCoreSpec, str], ...]:
        """The tensor-core entries registered for device `base` that its default renderer can emit. The others are
        rejected, each with a warning naming the plugin, when the device's tensor cores are first asked about:
        a description that can't be rendered would make every matmul it fits fail."""
        with self._lock:
            catalog = self._gather()
            if (kept := catalog.emittable.get(base)) is not None:
                return kept
            maker = next((r.make for r in catalog.renderers if r.device == base and r.default), None)
            try:
                renderer = maker() if maker is not None else None
            except Exception:  # noqa: BLE001 - a renderer that can't be made is reported when the device uses it
                renderer = None
            catalog.emittable[base] = kept = self._emittable(
                [(spec, plugin) for spec, plugin in catalog.tensor_cores if spec.device == base], renderer
            )
            return kept

    def _emittable(
        self, entries: list[tuple[TensorCoreSpec, str]], renderer: Renderer | None
    ) -> tuple[tuple[TensorCoreSpec, str], ...]:
        """`entries` without the descriptions `renderer` can't emit, each rejected with a warning naming the plugin
        (a device without a default renderer has nothing to check them against: they are kept)."""
        kept = []
        for spec, plugin in entries:
            good = []
            for tc in spec.tensor_cores:
                why = renderer.tensor_core_problem(tc, spec.target) if renderer is not None else None
                if why is None:
                    good.append(tc)
                    continue
                warnings.warn(
                    f"lazygrad plugin {plugin!r}: tensor core {tc} for {spec.device} {spec.target} was rejected: {why}",
                    LazygradPluginWarning,
                    stacklevel=6,
                )
                self._rejected.add((spec.device, tc))
            if good:
                kept.append((TensorCoreSpec(spec.device, spec.target, tuple(good)), plugin))
        return tuple(kept)

    # ---- questions

    @staticmethod
    def canonicalize(name: str) -> str:
        """The canonical form of a device name: "cpu" -> "CPU", "cuda:0" -> "CUDA", "cuda:1:ptx" -> "CUDA:1"."""
        return DeviceName.parse(name).canonical

    def installed(self) -> list[str]:
        """The names of the devices the installed plugins provide, sorted."""
        return sorted(self._gather().devices)

    def spec(self, name: str) -> DeviceSpec:
        """The `DeviceSpec` of the device `name` (any index or renderer suffix is ignored)."""
        base = DeviceName.parse(name).base
        devices = self._gather().devices
        if base not in devices:
            raise UnknownDeviceError(self._unknown_message(base, devices))
        return devices[base][0]

    def usable(self, name: str) -> str | None:
        """None if the device `name` can run on this machine, else the reason it can't. Checked once."""
        spec = self.spec(name)
        with self._lock:
            if spec.name not in self._usable:
                try:
                    reason = spec.usable()
                except Exception as exc:  # noqa: BLE001 - a crashing check means unusable, with the crash as reason
                    reason = f"its usability check raised {type(exc).__name__}: {exc}"
                self._usable[spec.name] = reason
            return self._usable[spec.name]

    def renderers(self, name: str) -> list[RendererSpec]:
        """The renderers offered for the device `name`, its default first."""
        base = self.spec(name).name
        found = [r for r in self._gather().renderers if r.device == base]
        return sorted(found, key=lambda r: not r.default)

    def tensor_cores(self, name: str, target: str | None = None) -> tuple[TensorCore, ...]:
        """The tensor cores registered for the device `name` on `target`, or on all its targets if target is None."""
        base = self.spec(name).name
        found: list[TensorCore] = []
        for entry, _ in self._tensor_core_entries(base):
            if target in (None, entry.target):
                found.extend(tc for tc in entry.tensor_cores if tc not in found)
        return tuple(found)

    def tensor_core_targets(self, name: str) -> tuple[str, ...]:
        """The targets of the device `name` that plugins registered tensor cores for, in registration order."""
        base = self.spec(name).name
        return tuple(dict.fromkeys(entry.target for entry, _ in self._tensor_core_entries(base)))

    def tensor_cores_for(self, name: str, renderer: Renderer) -> tuple[TensorCore, ...]:
        """The registered tensor cores that `renderer`, rendering for the device `name`, runs: the descriptions of
        every one of its `tensor_core_targets()`, merged (a newer target's additions never hide an older target's
        descriptions), without those it says it can't emit (each reported once, with the plugin's name)."""
        base = self.spec(name).name
        found: list[TensorCore] = []
        for target in renderer.tensor_core_targets():
            for entry, plugin in self._tensor_core_entries(base):
                if entry.target != target:
                    continue
                for tc in entry.tensor_cores:
                    if tc in found:
                        continue
                    if (why := renderer.tensor_core_problem(tc, target)) is None:
                        found.append(tc)
                    elif (base, tc) not in self._rejected:
                        self._rejected.add((base, tc))
                        warnings.warn(
                            f"lazygrad plugin {plugin!r}: tensor core {tc} for {base} {target} is not used by "
                            f"{type(renderer).__name__}: {why}",
                            LazygradPluginWarning,
                            stacklevel=3,
                        )
        return tuple(found)

    def _hand_tensor_cores(self, base: str, device: CompiledDevice) -> None:
        """Give the device's renderer the registered tensor cores it runs (a device without a renderer gets none)."""
        if isinstance(device.renderer, Renderer):
            device.renderer.add_tensor_cores(self.tensor_cores_for(base, device.renderer))

    def select(self, name: str) -> str:
        """The canonical name of the device `name`, after switching its renderer if the name names one: "CPU:C"
        means the same here (what the frontend's device= arguments go through) as in `DEV=CPU:C` and
        `Device["CPU:C"]`: the CPU device renders with C from now on."""
        parsed = DeviceName.parse(name)
        if parsed.renderer is not None:
            self[name]
        return parsed.canonical

    # ---- questions

    @property
    def DEFAULT(self) -> str:  # noqa: N802 - a constant-like name, as users write Device.DEFAULT
        """The canonical name of the default device: `DEV` if set, else the usable device of highest priority."""
        # asked for every new tensor: answer from a cache that DEV or a change of plugins invalidates
        key = (DEV.value, self._gather())
        if self._default is not None and self._default[0] == key[0] and self._default[1] is key[1]:
            return self._default[2]
        name = self._choose_default()
        self._default = (key[0], key[1], name)
        return name

    def _choose_default(self) -> str:
        if DEV.value:
            chosen = DeviceName.parse(DEV.value)
            if (reason := self.usable(chosen.base)) is not None:
                raise DeviceUnavailableError(f"DEV={DEV.value} names a device that is not usable here: {reason}")
            return chosen.canonical
        devices = self._gather().devices
        ranked = sorted((spec for spec, _ in devices.values()), key=lambda s: (-s.priority, s.name))
        reasons = []
        for spec in ranked:
            if (reason := self.usable(spec.name)) is None:
                # the default is opened now, so that a device that claims to be usable but can't open is passed over
                # here, with a warning, rather than failing every operation on the default device later
                try:
                    self[spec.name]
                except (DeviceUnavailableError, PluginError) as exc:
                    warnings.warn(
                        f"device {spec.name} from {spec.package} was skipped as the default device: {exc}",
                        LazygradPluginWarning,
                        stacklevel=4,
                    )
                    reasons.append(f"{spec.name} ({spec.package}): {self.usable(spec.name)}")
                    continue
                return spec.name
            reasons.append(f"{spec.name} ({spec.package}): {reason}")
        if not reasons:
            raise DeviceUnavailableError(
                "no lazygrad device is installed; install one, e.g. `pip install lazygrad-runtime-cpu`"
            )
        raise DeviceUnavailableError("no installed device is usable here: " + "; ".join(reasons))

    @contextlib.contextmanager
    def stand_in(self, name: str) -> Iterator[None]:
        """For tests that run a device over a stand-in for its driver (a fake libcuda, a fake Metal): inside the
        block the device `name` counts as usable here, whatever its own check says, and is opened afresh on first
        use; afterwards the registry forgets the device opened inside and asks the device's check again. The
        default device is not changed."""
        canonical = DeviceName.parse(name).canonical
        base = self.spec(name).name
        with self._lock:
            saved_usable, saved_device = self._usable.get(base), self._opened.pop(canonical, None)
            saved_renderer = self._renderer_in_use.pop(canonical, None)
            self._usable[base] = None
        try:
            yield
        finally:
            with self._lock:
                self._opened.pop(canonical, None)
                self._renderer_in_use.pop(canonical, None)
                self._usable.pop(base, None)
                if saved_usable is not None:
                    self._usable[base] = saved_usable
                if saved_device is not None:
                    self._opened[canonical] = saved_device
                if saved_renderer is not None:
                    self._renderer_in_use[canonical] = saved_renderer

    # ---- opening

    def __getitem__(self, name: str) -> CompiledDevice:
        """Open (once) and return the device `name`, switching its renderer if the name or `DEV` names one."""
        parsed = DeviceName.parse(name)
        spec = self.spec(parsed.base)
        canonical = parsed.canonical
        with self._lock:
            device = self._opened.get(canonical)
            if device is None:
                if (reason := self.usable(spec.name)) is not None:
                    raise DeviceUnavailableError(
                        f"device {canonical} (from {spec.package}) is installed but not usable here: {reason}"
                    )
                try:
                    device = spec.open(canonical)
                except Exception as exc:
                    # the device is unusable from now on, for the default choice too
                    self._usable[spec.name] = f"opening {canonical} raised {type(exc).__name__}: {exc}"
                    raise DeviceUnavailableError(
                        f"device {canonical} (from {spec.package}) failed to open: {type(exc).__name__}: {exc}"
                    ) from exc
                if not isinstance(device, CompiledDevice):
                    raise PluginError(
                        f"{spec.package} opened {canonical} as {type(device).__name__}, not a CompiledDevice"
                    )
                self._opened[canonical] = device
                if defaults := [r.name for r in self.renderers(spec.name) if r.default]:
                    self._renderer_in_use[canonical] = defaults[0]
                self._hand_tensor_cores(spec.name, device)
            wanted = parsed.renderer or self._renderer_from_dev(spec.name)
            # A renderer, once named, stays: later lookups by the plain name (e.g. a buffer's device) keep using it.
            if wanted is not None and self._renderer_in_use.get(canonical) != wanted:
                chosen = self._renderer_spec(spec.name, wanted)
                device.use_renderer(chosen.make(), chosen.compiler() if chosen.compiler is not None else None)
                self._hand_tensor_cores(spec.name, device)
                self._renderer_in_use[canonical] = wanted
            return device

    def _renderer_from_dev(self, base: str) -> str | None:
        if not DEV.value:
            return None
        chosen = DeviceName.parse(DEV.value)
        return chosen.renderer if chosen.base == base else None

    def _renderer_spec(self, base: str, renderer: str) -> RendererSpec:
        offered = self.renderers(base)
        for spec in offered:
            if spec.name == renderer:
                return spec
        names = ", ".join(r.name + (" (default)" if r.default else "") for r in offered) or "none registered"
        raise UnknownRendererError(f"device {base} has no renderer {renderer!r}; its renderers: {names}")

    # ---- listing

    def list(self) -> list[DeviceInfo]:
        """Every installed device, highest priority first: its package and version, whether it is usable here (or
        why not), whether it is the default, its renderers and its tensor cores per target architecture."""
        catalog = self._gather()
        try:
            default: str | None = DeviceName.parse(self.DEFAULT).base
        except DeviceUnavailableError:
            default = None  # nothing usable: every entry then says why
        out = []
        for spec, _ in sorted(catalog.devices.values(), key=lambda e: (-e[0].priority, e[0].name)):
            try:
                version: str | None = importlib.metadata.version(spec.package)
            except importlib.metadata.PackageNotFoundError:
                version = None
            cores: dict[str, tuple[TensorCore, ...]] = {}
            # those the device's renderer can emit (the others are rejected, with a warning, as they'd be on use)
            for entry, _ in self._tensor_core_entries(spec.name):
                cores[entry.target] = cores.get(entry.target, ()) + entry.tensor_cores
            out.append(
                DeviceInfo(
                    spec.name,
                    spec.package,
                    version,
                    spec.priority,
                    self.usable(spec.name),
                    spec.name == default,
                    tuple((r.name, r.default) for r in self.renderers(spec.name)),
                    cores,
                )
            )
        return out

    def _unknown_message(self, base: str, devices: dict[str, Any]) -> str:
        msg = f"unknown device {base!r}; installed devices: {', '.join(sorted(devices)) or 'none'}."
        if (package := WELL_KNOWN_DEVICES.get(base)) is not None:
            msg += f" {base} is provided by the package {package}: `pip install {package}`."
        return msg


Device = DeviceRegistry()
"""The process-wide registry, found through the installed distributions' `lazygrad` entry points."""


@functools.cache
def shares_host_memory(a: str, b: str) -> bool:
    """Whether a kernel on device `a` can take a buffer of device `b` by address and read it in place: both devices'
    allocators give out host memory of this process (`Allocator.shares_host_memory`, as CPU:0 and CPU:1 do)."""
    return all(getattr(Device[d].allocator, "shares_host_memory", False) for d in (a, b))
