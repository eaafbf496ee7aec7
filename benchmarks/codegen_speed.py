"""Code generation's CPU time on the kernels of real models, per phase, and the CPU time of scheduling them.

`capture` runs a workload's first step once (compile.py's workloads: resnet, convnet, gpt2) with an empty cache
directory, timing every `kernelize` call (scheduling), and pickles the kernels it generated: (device, kernel AST, the
opts they got). `time` then generates every kept kernel again in a fresh process, as a cold first step does
(`get_program` with the opts codegen chooses, the cycle collector paused as in a realize), and prints the CPU seconds
(`time.process_time`, which other load on the machine disturbs less than wall time) of each phase: choosing opts,
lowering, each rewrite pass, vector grouping, linearizing, rendering, and the program cache's key and packing. It
also prints a digest of the rendered sources (`--sources DIR`: every source, one file per kernel) so that two
versions of codegen can be checked to generate exactly the same programs, and warns where the opts chosen differ
from the captured ones. `--profile` adds a cProfile of the timing, sorted by own time.

A rewrite remembers its results on the nodes it made, so a second pass over the same kernels in one process finds
much already simplified: each timing run is a fresh process, and the median over `--runs` of them is printed. With
no arguments: capture the conv net and ResNet-18 and time them.

    python benchmarks/codegen_speed.py capture resnet convnet --out /tmp/kernels
    python benchmarks/codegen_speed.py time /tmp/kernels/resnet.pkl /tmp/kernels/convnet.pkl [--runs 3]
        [--sources DIR] [--profile]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_WORKLOADS = ("resnet", "convnet")


def capture(name: str, out: Path) -> None:
    """Run workload `name`'s first step, print the CPU seconds its scheduling took, and pickle its kernels as a list
    of (device, ast, opts) to `out/<name>.pkl`."""
    os.environ["CACHEDIR"] = tempfile.mkdtemp(prefix="lazygrad-codegen-speed-")
    os.environ["PROGRESS"] = "0"
    sys.path.insert(0, str(Path(__file__).parent))
    from compile import WORKLOADS  # the workloads live there

    import lazygrad.engine as engine
    from lazygrad import compiling

    kernels: list[tuple[str, Any, tuple]] = []
    spent = [0.0, 0]
    kernelize, cached_program = engine.kernelize, compiling.cached_program

    def timed_kernelize(outputs: list) -> dict:
        st = time.process_time()
        try:
            return kernelize(outputs)
        finally:
            spent[0] += time.process_time() - st
            spent[1] += 1

    def recording(ast: Any, renderer: Any, opts: Any = None) -> Any:
        spec = cached_program(ast, renderer, opts)
        kernels.append((renderer.device, ast, spec.opts))
        return spec

    engine.kernelize, compiling.cached_program = timed_kernelize, recording
    step = WORKLOADS[name]()
    st = time.process_time()
    step()
    total = time.process_time() - st
    (out / f"{name}.pkl").write_bytes(pickle.dumps(kernels))
    print(
        f"{name}: first step {total:.2f} CPU s, kernelize {spent[0]:.2f} CPU s in {spent[1]} calls, "
        f"{len(kernels)} kernels"
    )


def _timed(phases: dict[str, float], label: Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, adding the CPU seconds of each call to `phases[label(*args)]`, less those of the phases it calls."""
    stack: list[float] = _timed.__dict__.setdefault("stack", [])

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        stack.append(0.0)
        t = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.process_time() - t
            inner = stack.pop()
            phases[label(*args, **kwargs)] += spent - inner
            if stack:
                stack[-1] += spent

    return wrapper


def time_codegen(paths: list[Path], sources: Path | None, profile: bool) -> dict[str, dict[str, float]]:
    """Generate every kernel kept in `paths` once, in this process; CPU seconds per workload and phase. Prints the
    sources' digest (and writes them to `sources`), and a profile with `profile`."""
    from lazygrad_codegen import program, program_cache
    from lazygrad_uop.registry import Device

    phases: dict[str, float] = defaultdict(float)
    # the module globals get_program and program_of call, each wrapped to add its CPU time to a phase
    program.optimized_kernel = _timed(phases, lambda *a, **k: "choose opts", program.optimized_kernel)
    program.lower = _timed(phases, lambda *a, **k: "lower", program.lower)
    program.guard_divisions = _timed(phases, lambda *a, **k: "guard divisions", program.guard_divisions)
    program.graph_rewrite = _timed(phases, lambda *a, **k: "rewrite: " + k.get("name", "?"), program.graph_rewrite)
    program.group_memory = _timed(phases, lambda *a, **k: "group memory", program.group_memory)
    program.linearize = _timed(phases, lambda *a, **k: "linearize", program.linearize)
    program_key = _timed(phases, lambda *a, **k: "program cache: key", program_cache.program_key)
    pack_spec = _timed(phases, lambda *a, **k: "program cache: pack", program_cache.pack_spec)
    result: dict[str, dict[str, float]] = {}
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    for path in paths:
        kernels = pickle.loads(path.read_bytes())
        renderers = {device: Device[device].renderer for device, _, _ in kernels}
        for r in renderers.values():
            r.render = _timed(phases, lambda *a, **k: "render", r.render)
        phases.clear()
        digest = hashlib.sha256()
        srcs: list[str] = []
        differ = 0
        if prof is not None:
            prof.enable()
        # as in a realize, which pauses the cycle collector while it compiles (lazygrad.engine)
        gc.disable()
        st = time.process_time()
        for device, ast, opts in kernels:
            renderer = renderers[device]
            program_key(ast, renderer)
            spec = program.get_program(ast, renderer)
            pack_spec(spec)
            differ += tuple(spec.opts) != tuple(opts)
            digest.update(spec.src.encode())
            srcs.append(spec.src)
        total = time.process_time() - st
        gc.enable()
        if prof is not None:
            prof.disable()
        for r in renderers.values():
            del r.render
        if differ:
            print(f"warning: {path.stem}: {differ} kernels got other opts than when captured", file=sys.stderr)
        if sources is not None:
            sources.mkdir(parents=True, exist_ok=True)
            for n, src in enumerate(srcs):
                (sources / f"{path.stem}_{n:03d}.src").write_text(src)
        result[path.stem] = {**phases, "total": total, "kernels": len(kernels), "digest": digest.hexdigest()[:16]}
    if prof is not None:
        import pstats

        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(40)
    return result


def time_in_processes(paths: list[Path], runs: int, sources: Path | None, profile: bool) -> None:
    """`time_codegen` in `runs` fresh processes; prints the median CPU seconds per workload and phase."""
    per_run: list[dict[str, dict[str, Any]]] = []
    for n in range(runs):
        args = [sys.executable, __file__, "_child", *map(str, paths)]
        if sources is not None and n == 0:
            args += ["--sources", str(sources)]
        if profile and n == 0:
            args.append("--profile")
        done = subprocess.run(args, check=True, stdout=subprocess.PIPE, text=True)
        per_run.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for path in paths:
        runs_of = [r[path.stem] for r in per_run]
        digests = {r["digest"] for r in runs_of}
        first = runs_of[0]
        print(f"{path.stem}: {first['kernels']} kernels, sources {'/'.join(sorted(digests))}")
        print(f"  CPU seconds, median of {runs} fresh processes")
        names = [k for k in first if k not in ("kernels", "digest")]
        for k in sorted(names, key=lambda k: -statistics.median(r.get(k, 0.0) for r in runs_of)):
            print(f"  {k:40s} {statistics.median(r.get(k, 0.0) for r in runs_of):8.3f}")


def main() -> None:
    """Capture kernels, or time code generation on them (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd")
    cap = sub.add_parser("capture", help="run workloads' first steps and keep their kernels")
    cap.add_argument("workloads", nargs="+", choices=("resnet", "convnet", "gpt2"))
    cap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()))
    for name in ("time", "_child"):
        gen = sub.add_parser(name, help="time code generation on captured kernels" if name == "time" else None)
        gen.add_argument("paths", nargs="+", type=Path)
        gen.add_argument("--sources", type=Path, help="a folder to write every kernel's source into")
        gen.add_argument("--profile", action="store_true", help="print a cProfile of the (first) run to stderr")
        if name == "time":
            gen.add_argument("--runs", type=int, default=3, help="fresh processes to take the median of")
    args = parser.parse_args()
    os.environ["PROGRAM_CACHE"] = "0"
    if args.cmd == "capture":
        args.out.mkdir(parents=True, exist_ok=True)
        for name in args.workloads:
            capture(name, args.out)
    elif args.cmd == "_child":
        print(json.dumps(time_codegen(args.paths, args.sources, args.profile)))
    elif args.cmd == "time":
        time_in_processes(args.paths, args.runs, args.sources, args.profile)
    else:
        out = Path(tempfile.mkdtemp(prefix="lazygrad-codegen-speed-"))
        for name in DEFAULT_WORKLOADS:
            # each capture in a fresh process, so that one workload's kernels don't warm the other's
            done = subprocess.run(
                [sys.executable, __file__, "capture", name, "--out", str(out)],
                check=True,
                stdout=subprocess.PIPE,
                text=True,
            )
            print(done.stdout.strip().splitlines()[-1])
        time_in_processes([out / f"{name}.pkl" for name in DEFAULT_WORKLOADS], 3, None, False)


if __name__ == "__main__":
    main()
