"""The lazygrad plugin of the CPU device: registers `CPU`, rendered with the LLVM renderer (`CPU:LLVM`, the default)
and compiled with llvmlite for the host."""

from __future__ import annotations

# defines the CPU_THREADS setting as soon as the plugin loads, so that Context(CPU_THREADS=n) knows it
from lazygrad_cpu.threads import CPU_THREADS  # noqa: F401
from lazygrad_uop.device import CompiledDevice, Renderer
from lazygrad_uop.plugins import DeviceSpec, RendererSpec, hookimpl

# below dedicated accelerators (100), above reference and emulated devices such as PYTHON (0)
PRIORITY = 50


def cpu_usable() -> str | None:
    """None when llvmlite imports and can target this CPU, else why not."""
    try:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.Target.from_triple(llvm.get_process_triple())
    except Exception as exc:  # noqa: BLE001 - llvmlite reports a missing or broken LLVM library in several ways
        return f"llvmlite can't target this CPU: {type(exc).__name__}: {exc}"
    return None


def open_cpu(name: str) -> CompiledDevice:
    """Open the CPU device `name`: "CPU", "CPU:1", ... are distinct devices of the same host, each with its own
    buffers (so that several-device code, sharding and all-reduce run and are tested without several
    accelerators); their kernels share the host's cores and the compiler cache."""
    from lazygrad_cpu.allocator import CPUAllocator
    from lazygrad_cpu.compiler import LLVMCompiler
    from lazygrad_cpu.graph import CPUGraph
    from lazygrad_cpu.program import CPUProgram
    from lazygrad_cpu.renderer import CPURenderer

    global _shared_renderer
    if _shared_renderer is None:
        _shared_renderer = CPURenderer()
    # one renderer for every CPU device: the host is the same target, so each kernel is generated once for all
    return CompiledDevice(name, CPUAllocator(), _shared_renderer, LLVMCompiler(), CPUProgram, CPUGraph)


_shared_renderer: Renderer | None = None


def _make_renderer() -> Renderer:
    # imported here: codegen is only needed once a renderer is asked for
    from lazygrad_cpu.renderer import CPURenderer

    return CPURenderer()


@hookimpl
def lazygrad_devices() -> list[DeviceSpec]:
    """The CPU device."""
    return [DeviceSpec("CPU", open=open_cpu, usable=cpu_usable, priority=PRIORITY, package="lazygrad-runtime-cpu")]


@hookimpl
def lazygrad_renderers() -> list[RendererSpec]:
    """LLVM IR, the CPU's default (and for now only) renderer."""
    return [RendererSpec("CPU", "LLVM", make=_make_renderer, default=True)]
