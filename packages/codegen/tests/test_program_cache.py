"""The program cache: a cached program is the one `get_program` generates for that very kernel and renderer, from
memory or from disk, never another kernel's or another renderer's; a damaged entry is regenerated."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import tempfile
import tomllib
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lazygrad_codegen import CRenderer, LLVMRenderer, ProgramSpec, get_program, kernel_ast
from lazygrad_codegen import program_cache as pc
from lazygrad_uop.config import Context
from lazygrad_uop.diskcache import CACHE_VERSION, CacheWarning
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp


class WideCRenderer(CRenderer):
    """The C renderer with another device name and vector width: a different renderer for the same kernels."""

    device = "WIDE"
    vector_width = 4


RENDERERS = [CRenderer(), WideCRenderer(), LLVMRenderer()]

UNARY = [lambda x: x * 2.0, lambda x: x + 1.5, lambda x: x.maximum(0.25), lambda x: -x]


@st.composite
def kernels(draw: st.DrawFn) -> UOp:
    """A random elementwise or reducing kernel over one or two float32 inputs."""
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    x = kernel_ast.load(1, dtypes.float32, kernel_ast.st(*shape))
    if draw(st.booleans()):
        x = x + kernel_ast.load(2, dtypes.float32, kernel_ast.st(*shape))
    for f in draw(st.lists(st.sampled_from(UNARY), max_size=3)):
        x = f(x)
    out_shape = shape
    if draw(st.booleans()):
        axis = draw(st.integers(0, len(shape) - 1))
        x = kernel_ast.reduce(x, draw(st.sampled_from([Ops.ADD, Ops.MAX])), (axis,))
        out_shape = tuple(1 if i == axis else d for i, d in enumerate(shape))
    return kernel_ast.sink(kernel_ast.store(0, x, kernel_ast.st(*out_shape)))


def same_program(a: ProgramSpec, b: ProgramSpec) -> bool:
    return (a.name, a.src, a.device, a.global_size, a.local_size, a.vars, a.globals, a.outs, a.ins, a.opts) == (
        b.name,
        b.src,
        b.device,
        b.global_size,
        b.local_size,
        b.vars,
        b.globals,
        b.outs,
        b.ins,
        b.opts,
    ) and list(a.uops) == list(b.uops)


@pytest.fixture
def cachedir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    pc._memory.clear()
    return tmp_path


@settings(max_examples=25, deadline=None)
@given(asts=st.lists(kernels(), min_size=2, max_size=3), r=st.sampled_from(RENDERERS))
def test_cache_returns_the_program_of_that_kernel_and_renderer(asts: list[UOp], r: CRenderer) -> None:
    # an empty cache per example: a kernel's name says which kernels this process named before it, so a program an
    # earlier example stored for an equal kernel (since collected) may carry another name than a fresh one
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        mp.setenv("CACHEDIR", d)
        pc._memory.clear()
        check_cached_programs(asts, r)


@contextlib.contextmanager
def _generating() -> Iterator[list[UOp]]:
    """The kernels `cached_program` generates (rather than reads) while the block runs."""
    generated: list[UOp] = []
    real = pc.get_program
    pc.get_program = lambda ast, *args: generated.append(ast) or real(ast, *args)  # type: ignore[assignment]
    try:
        yield generated
    finally:
        pc.get_program = real


def check_cached_programs(asts: list[UOp], r: CRenderer) -> None:
    """Each of `asts` gets from the cache, in memory and from disk, exactly the program `get_program` generates."""
    with Context(PROGRAM_CACHE=0):
        fresh = [get_program(a, r) for a in asts]
    # first through the cache (generating and storing), then from disk alone, as a new process would
    first = [pc.cached_program(a, r) for a in asts]
    pc._memory.clear()
    with _generating() as generated:
        second = [pc.cached_program(a, r) for a in asts]
    assert not generated, "a kernel stored on disk was generated again"
    for a, want, got1, got2 in zip(asts, fresh, first, second):
        assert same_program(got1, want) and same_program(got2, want), f"wrong program for {a}"


@settings(max_examples=25, deadline=None)
@given(a=kernels(), r=st.sampled_from(RENDERERS), data=st.data())
def test_unpacked_uops_are_built_on_first_use_and_read_as_the_list(a: UOp, r: CRenderer, data: st.DataObject) -> None:
    with Context(PROGRAM_CACHE=0):
        want = get_program(a, r)
    got = pc.unpack_spec(pc.pack_spec(want))
    assert isinstance(got.uops, pc.DeferredUOps) and list.__len__(got.uops) == 0  # nothing built yet
    assert same_program(got, want)
    # every way of reading a list reads the program's UOps
    ref, lazy = want.uops, pc.unpack_spec(pc.pack_spec(want)).uops
    i = data.draw(st.integers(-len(ref), len(ref) - 1))
    assert lazy[i] is ref[i] and lazy[1:-1] == ref[1:-1] and len(lazy) == len(ref)
    assert lazy == ref and ref == lazy and not lazy != ref and lazy.index(ref[i]) == ref.index(ref[i])
    assert list(reversed(lazy)) == ref[::-1] and ref[i] in lazy and lazy.count(ref[i]) == ref.count(ref[i])
    assert lazy + [ref[0]] == [*ref, ref[0]] and lazy.copy() == ref and bool(lazy) == bool(ref)
    # packed again (a spec read from the cache, stored under another key) it is the same program
    assert same_program(pc.unpack_spec(pc.pack_spec(got)), want)


@settings(max_examples=25, deadline=None)
@given(a=kernels(), r=st.sampled_from(RENDERERS), data=st.data())
def test_packing_keeps_uops_in_any_order(a: UOp, r: CRenderer, data: st.DataObject) -> None:
    # a linear program lists each node after its sources, which packing relies on to add one row per node; a list in
    # another order (some nodes before their sources) must come back the same all the same
    with Context(PROGRAM_CACHE=0):
        want = get_program(a, r)
    order = data.draw(st.permutations(want.uops))
    shuffled = dataclasses.replace(want, uops=list(order))
    got = pc.unpack_spec(pc.pack_spec(shuffled))
    assert list(got.uops) == list(order)
    assert all(x is y for x, y in zip(got.uops, order))


@settings(max_examples=40, deadline=None)
@given(a=kernels(), b=kernels(), r1=st.sampled_from(RENDERERS), r2=st.sampled_from(RENDERERS))
def test_keys_tell_kernels_and_renderers_apart(a: UOp, b: UOp, r1: CRenderer, r2: CRenderer) -> None:
    same = a is b and r1 is r2
    assert (pc.program_key(a, r1) == pc.program_key(b, r2)) == same
    # the key is structural: equal text for the same graph, so it matches across processes
    assert (pc.structural_hash(a) == pc.structural_hash(b)) == (a is b)


def test_settings_are_part_of_the_key() -> None:
    ast = kernel_ast.row_reduce("sum", dtypes.float32, 4, 8)
    r = CRenderer()
    keys = set()
    for noopt in (0, 1):
        with Context(NOOPT=noopt):
            keys.add(pc.program_key(ast, r))
    assert len(keys) == 2


def test_corrupt_entry_is_detected_and_regenerated(cachedir: Path) -> None:
    ast = kernel_ast.row_reduce("max", dtypes.float32, 3, 5)
    r = CRenderer()
    want = pc.cached_program(ast, r)
    with sqlite3.connect(cachedir / "lazygrad" / "cache.db") as conn:
        (val,) = conn.execute(f"SELECT val FROM program_v{CACHE_VERSION}").fetchone()
        conn.execute(f"UPDATE program_v{CACHE_VERSION} SET val = ?", (val[: len(val) // 2] + b"\x00" * 8,))
    pc._memory.clear()
    with pytest.warns(CacheWarning, match="checksum"):
        got = pc.cached_program(ast, r)
    assert same_program(got, want)
    pc._memory.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt entry reads back cleanly
        assert same_program(pc.cached_program(ast, r), want)


def test_package_sources_are_part_of_the_key() -> None:
    fp = pc.package_fingerprint("lazygrad_codegen")
    assert fp.startswith("lazygrad_codegen:") and len(fp.rsplit(":", 1)[1]) == 16
    assert pc.package_fingerprint("lazygrad_codegen.program") == fp  # one per top-level package
    # the package's version (its pyproject's): a new release is a new key even where the sources read the same
    pyproject = Path(pc.__file__).parents[2] / "pyproject.toml"
    assert fp.split(":")[1] == tomllib.loads(pyproject.read_text())["project"]["version"]


def test_debug_output_is_printed_on_a_warm_cache(cachedir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ast = kernel_ast.row_reduce("sum", dtypes.float32, 5, 3)
    spec = pc.cached_program(ast, CRenderer())
    capsys.readouterr()
    with Context(DEBUG=4):
        assert same_program(pc.cached_program(ast, CRenderer()), spec)
    assert spec.src in capsys.readouterr().out


# *** generating many programs at once, in forked workers ***

needs_fork = pytest.mark.skipif(not pc.can_fork_codegen(), reason="programs are generated in forked workers on Linux")


def _distinct_kernels(n: int) -> list[UOp]:
    """n different elementwise and reducing kernels."""
    out = []
    for i in range(n):
        x = kernel_ast.load(1, dtypes.float32, kernel_ast.st(i + 3, 5)) * float(i + 1)
        if i % 2:
            out.append(
                kernel_ast.sink(kernel_ast.store(0, kernel_ast.reduce(x, Ops.ADD, (1,)), kernel_ast.st(i + 3, 1)))
            )
        else:
            out.append(kernel_ast.sink(kernel_ast.store(0, x, kernel_ast.st(i + 3, 5))))
    return out


@needs_fork
@pytest.mark.parametrize("r", [CRenderer(), LLVMRenderer()], ids=["C", "LLVM"])
def test_forked_workers_generate_the_programs_this_process_would(cachedir: Path, r: CRenderer) -> None:
    asts = _distinct_kernels(pc.FORK_MIN_PROGRAMS + 3)
    assert pc.generate_programs([(a, r) for a in asts + asts[:2]], 2) == len(asts)
    with _generating() as generated:
        got = [pc.cached_program(a, r) for a in asts]
    assert not generated, "a program the workers generated was generated again"
    with Context(PROGRAM_CACHE=0):
        for a, spec in zip(asts, got, strict=True):
            # the name this process gave the kernel before the fork, and the program it would have generated
            want = get_program(a, r)
            assert spec.name == want.name and same_program(spec, want)
    # on disk too, as a new process would find them
    pc._memory.clear()
    assert pc.generate_programs([(a, r) for a in asts], 2) == 0
    assert all(same_program(pc.cached_program(a, r), spec) for a, spec in zip(asts, got, strict=True))


@needs_fork
def test_few_programs_or_one_process_stay_here(cachedir: Path) -> None:
    r = CRenderer()
    asts = _distinct_kernels(pc.FORK_MIN_PROGRAMS)
    assert pc.generate_programs([(a, r) for a in asts[:-1]], 4) == 0
    assert pc.generate_programs([(a, r) for a in asts], 1) == 0
    with Context(BEAM=1):
        assert not pc.can_fork_codegen() and pc.generate_programs([(a, r) for a in asts], 4) == 0
    assert not pc._memory


class _FailingRenderer(CRenderer):
    """Renders every kernel but those whose input has `bad` rows of 5, on which it raises or, in a forked worker,
    exits."""

    device = "FAILING"

    def __init__(self, bad: int, exit_worker: bool) -> None:
        self.bad, self.exit_worker, self.parent = bad, exit_worker, os.getpid()

    def render(self, uops):
        if any(u.op is Ops.DEFINE_GLOBAL and u.dtype.size == self.bad * 5 for u in uops):
            if self.exit_worker and os.getpid() != self.parent:
                os._exit(3)
            raise ValueError("this renderer can't render that kernel")
        return super().render(uops)


@needs_fork
def test_a_codegen_error_is_raised_here_with_its_own_traceback(cachedir: Path) -> None:
    r = _FailingRenderer(bad=4, exit_worker=False)
    asts = _distinct_kernels(pc.FORK_MIN_PROGRAMS + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert pc.generate_programs([(a, r) for a in asts], 2) == 0
    with pytest.raises(ValueError, match="can't render that kernel"):
        for a in asts:
            pc.cached_program(a, r)


@needs_fork
def test_a_lost_worker_warns_and_this_process_generates(cachedir: Path) -> None:
    r = _FailingRenderer(bad=4, exit_worker=True)
    asts = _distinct_kernels(pc.FORK_MIN_PROGRAMS + 1)
    with pytest.warns(RuntimeWarning, match="code generation worker was lost"):
        assert pc.generate_programs([(a, r) for a in asts], 2) == 0
    # here the renderer raises instead of exiting
    with pytest.raises(ValueError, match="can't render that kernel"):
        for a in asts:
            pc.cached_program(a, r)
