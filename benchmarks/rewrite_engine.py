"""The IR engine's speed on fixed workloads: CPU seconds (`time.process_time`, so other load on the machine counts
less) of code generation for the kernels of real models' first steps, and of scheduling those steps.

`capture` runs a workload's first step once (compile.py's workloads: resnet, gpt2, convnet) with an empty cache,
timing every `kernelize` call, and keeps the (device, kernel AST) pairs it compiled in a pickle. `codegen` then times
`get_program` on every kept AST in a fresh process and prints a digest of the rendered sources (`--sources`: each
program's source), so that two versions of the engine can be checked to generate exactly the same programs. With no
arguments: both steps for the conv net and ResNet-18, each in a fresh process.

    python benchmarks/rewrite_engine.py capture convnet resnet --out /tmp/asts
    python benchmarks/rewrite_engine.py codegen /tmp/asts/convnet.pkl /tmp/asts/resnet.pkl [--profile] [--sources DIR]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def capture(name: str, out: Path) -> None:
    """Run workload `name`'s first step, print the CPU seconds its scheduling took, and pickle its kernel ASTs."""
    os.environ["CACHEDIR"] = tempfile.mkdtemp(prefix="lazygrad-engine-bench-")
    os.environ["PROGRESS"] = "0"
    sys.path.insert(0, str(Path(__file__).parent))
    from compile import WORKLOADS

    import lazygrad.engine as engine

    jobs: list[tuple[str, object]] = []
    spent = [0.0, 0]
    kernelize, compile_runners = engine.kernelize, engine.compile_runners

    def timed_kernelize(outputs: list) -> dict:
        st = time.process_time()
        try:
            return kernelize(outputs)
        finally:
            spent[0] += time.process_time() - st
            spent[1] += 1

    def kept_compile_runners(todo: list) -> None:
        jobs.extend(todo)
        compile_runners(todo)

    engine.kernelize, engine.compile_runners = timed_kernelize, kept_compile_runners
    step = WORKLOADS[name]()
    st = time.process_time()
    step()
    total = time.process_time() - st
    kept = list(dict.fromkeys(jobs))
    (out / f"{name}.pkl").write_bytes(pickle.dumps(kept))
    print(
        f"{name}: first step {total:.2f} CPU s, kernelize {spent[0]:.2f} CPU s in {spent[1]} calls, {len(kept)} kernels"
    )


def codegen(paths: list[Path], profile: bool, sources: Path | None = None) -> None:
    """CPU seconds of `get_program` over the kernels kept in `paths`, and a digest of the programs it renders (with
    `sources`: every program's source, into that folder, to compare kernel by kernel)."""
    from lazygrad_codegen.program import get_program
    from lazygrad_uop.registry import Device

    for path in paths:
        jobs = pickle.loads(path.read_bytes())
        digest = hashlib.sha256()
        srcs: list[str] = []
        prof = None
        if profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        # as in a realize, which pauses the cycle collector while it compiles (lazygrad.engine)
        gc.disable()
        st = time.process_time()
        for device, ast in jobs:
            spec = get_program(ast, Device[device].renderer)
            digest.update(spec.src.encode())
            srcs.append(spec.src)
        spent = time.process_time() - st
        gc.enable()
        if sources is not None:
            sources.mkdir(parents=True, exist_ok=True)
            (sources / f"{path.stem}.json").write_text(json.dumps(srcs))
        if prof is not None:
            import pstats

            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(35)
        print(f"{path.stem}: get_program on {len(jobs)} kernels {spent:.2f} CPU s, sources {digest.hexdigest()[:16]}")


def run_all(workloads: list[str]) -> None:
    """Capture each workload and time its code generation, each step in a fresh process."""
    out = Path(tempfile.mkdtemp(prefix="lazygrad-engine-bench-"))
    for name in workloads:
        for args in (["capture", name, "--out", str(out)], ["codegen", str(out / f"{name}.pkl")]):
            done = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True)
            print(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    cap = sub.add_parser("capture")
    cap.add_argument("workloads", nargs="+")
    cap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()))
    gen = sub.add_parser("codegen")
    gen.add_argument("paths", nargs="+", type=Path)
    gen.add_argument("--profile", action="store_true")
    gen.add_argument("--sources", type=Path, help="a folder to write each workload's program sources into")
    args = parser.parse_args()
    if args.cmd == "capture":
        args.out.mkdir(parents=True, exist_ok=True)
        for name in args.workloads:
            capture(name, args.out)
    elif args.cmd == "codegen":
        codegen(args.paths, args.profile, args.sources)
    else:
        run_all(["convnet", "resnet"])


if __name__ == "__main__":
    main()
