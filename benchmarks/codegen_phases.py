"""Code generation's CPU time per phase on the kernels of real models: lowering, each rewrite pass of `program_of`,
vector grouping, linearizing and rendering.

The kernels (AST, renderer, the opts they got) are captured once from a cold first step of the workloads of
`compile.py` (ResNet-18 training, batch 8 at 64x64; the conv net's Adam step) and pickled, so that runs before and
after a change time the same kernels. Times are `time.process_time()` (CPU seconds of this process), which a machine
loaded by other work disturbs less than wall time. Passes after the first in one process find some of the kernels'
index arithmetic already simplified (the rewrite engine remembers it on nodes that stay alive), so compare first
passes: the default is one pass, and a median is taken over runs in fresh processes.

    python benchmarks/codegen_phases.py --capture /tmp/kernels.pkl     # once: run the steps, keep the kernels
    python benchmarks/codegen_phases.py --kernels /tmp/kernels.pkl     # time program_of on them, per phase
    python benchmarks/codegen_phases.py                                # both, through a temporary file
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

os.environ.setdefault("CACHEDIR", tempfile.mkdtemp(prefix="lazygrad-codegen-phases-"))
os.environ["PROGRAM_CACHE"] = "0"

WORKLOADS = ("resnet", "convnet")


def capture(path: str) -> None:
    """Run each workload's first step and pickle the kernels it generated: {workload: [(ast, device, opts)]}."""
    sys.path.insert(0, os.path.dirname(__file__))
    import compile as bench  # the workloads live there

    from lazygrad import compiling

    captured: dict[str, list[tuple[Any, str, tuple]]] = {}
    original = compiling.cached_program
    for name in WORKLOADS:
        kernels: list[tuple[Any, str, tuple]] = []

        def recording(ast: Any, renderer: Any, opts: Any = None, _into: list = kernels) -> Any:
            spec = original(ast, renderer, opts)
            _into.append((ast, renderer.device, spec.opts))
            return spec

        compiling.cached_program = recording
        step = {"resnet": bench.resnet_step, "convnet": bench.convnet_step}[name]()
        step()
        captured[name] = kernels
        print(f"{name}: {len(kernels)} kernels", file=sys.stderr)
    compiling.cached_program = original
    with open(path, "wb") as f:
        pickle.dump(captured, f)


def _timed(phases: dict[str, float], label: Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[label(*args, **kwargs)] += time.process_time() - t

    return wrapper


def time_phases(path: str, repeat: int, dump: str | None = None) -> None:
    """Time `program_of` on the captured kernels, per phase, median of `repeat` passes; with `dump`, write each
    kernel's source to `<dump>/<workload>_<n>.src` (to compare the programs of two versions of codegen)."""
    from lazygrad_codegen import program
    from lazygrad_codegen.kernel import Kernel
    from lazygrad_uop.registry import Device

    with open(path, "rb") as f:
        captured = pickle.load(f)
    phases: dict[str, float] = defaultdict(float)
    # the module globals program_of calls, each wrapped to add its CPU time to a phase
    program.lower = _timed(phases, lambda *a, **k: "lower", program.lower)
    program.guard_divisions = _timed(phases, lambda *a, **k: "guard_divisions", program.guard_divisions)
    program.graph_rewrite = _timed(phases, lambda *a, **k: "rewrite: " + k.get("name", "?"), program.graph_rewrite)
    program.group_memory = _timed(phases, lambda *a, **k: "group_memory", program.group_memory)
    program.linearize = _timed(phases, lambda *a, **k: "linearize", program.linearize)
    for name, kernels in captured.items():
        renderer = Device[kernels[0][1]].renderer
        renderer.render = _timed(phases, lambda *a, **k: "render", renderer.render)
        runs: dict[str, list[float]] = defaultdict(list)
        for _ in range(repeat):
            phases.clear()
            t = time.process_time()
            specs = [program.program_of(Kernel(ast, renderer).apply_opts(list(opts))) for ast, _dev, opts in kernels]
            total = time.process_time() - t
            for k, v in phases.items():
                runs[k].append(v)
            runs["total program_of"].append(total)
        if dump:
            os.makedirs(dump, exist_ok=True)
            for n, spec in enumerate(specs):
                with open(os.path.join(dump, f"{name}_{n:03d}.src"), "w") as f:
                    f.write(spec.src)
        print(f"{name}: {len(kernels)} kernels, CPU seconds, median of {repeat}")
        for k, vs in sorted(runs.items(), key=lambda kv: -statistics.median(kv[1])):
            print(f"  {k:40s} {statistics.median(vs):8.3f}")
        del renderer.render


def main() -> None:
    """Capture kernels or time them (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capture", help="run the workloads and pickle their kernels to this file")
    parser.add_argument("--kernels", help="time program_of on the kernels pickled in this file")
    parser.add_argument("--repeat", type=int, default=1, help="passes in this process (the first is the cold one)")
    parser.add_argument("--dump", help="with --kernels: write each kernel's source into this folder")
    args = parser.parse_args()
    if not (args.capture or args.kernels):
        # neither: capture into a temporary file and time those kernels (what `nox -s bench` runs)
        args.capture = args.kernels = os.path.join(tempfile.mkdtemp(prefix="lazygrad-codegen-phases-"), "kernels.pkl")
    if args.capture:
        capture(args.capture)
    if args.kernels:
        time_phases(args.kernels, args.repeat, args.dump)


if __name__ == "__main__":
    main()
