"""Stand-ins for a device's parts that do nothing: what the registry tests need to build a `CompiledDevice` with
lazygrad-uop alone (the testkit's stand-ins need the frontend and codegen, which uop's tests must run without)."""

from __future__ import annotations

from typing import Any

from lazygrad_uop.device import Compiler, LRUAllocator, Program, Renderer


class NamedRenderer(Renderer):
    """A renderer whose every program is its name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def render(self, uops: list[Any]) -> str:
        return self.name


class NullCompiler(Compiler):
    """Compiles a source to its bytes."""

    def compile(self, src: str) -> bytes:
        return src.encode()


class NullProgram(Program):
    """A program that runs nothing."""

    def __call__(self, *bufs: Any, global_size=(1, 1, 1), local_size=(1, 1, 1), vals=(), wait=False) -> float | None:
        return None


class NullAllocator(LRUAllocator):
    """Host bytearrays."""

    def _alloc(self, size: int, options: Any) -> Any:
        return bytearray(size)

    def _free(self, handle: Any, options: Any) -> None:
        pass

    def _copyin(self, dest: Any, src: memoryview) -> None:
        dest[:] = src

    def _copyout(self, dest: memoryview, src: Any) -> None:
        dest[:] = src
