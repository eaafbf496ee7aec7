"""Workgroups for kernels whose speed is that of memory (elementwise kernels on GPUs): enough threads per workgroup
for the multiprocessor to keep loads in flight, each thread moving the 16-byte vectors the heuristic gave it, and a
length that no workgroup divides padded (its last workgroup's extra threads masked) rather than a second launch."""

from __future__ import annotations

from lazygrad_codegen.kernel import AxisType, Kernel, KernelOptError, Opt, OptOps

# threads per workgroup of an elementwise kernel: 128 to 512 keep an SM's load queue full at any occupancy
ELEMENTWISE_THREADS = 256


def elementwise_workgroups(k: Kernel, reductions: bool = False, threads: int = ELEMENTWISE_THREADS) -> bool:
    """On a GPU, LOCAL axes of `threads` threads in all over the output axes of an elementwise kernel
    (with `reductions`, also of one whose threads each loop over a short reduction of their own), innermost first;
    where they can't give at least half of that, the innermost output axis is padded to whole workgroups first.
    Returns whether it applied (False leaves the kernel as it was)."""
    r = k.renderer
    if (k.reduceops and not reductions) or not r.has_local or k.axes(AxisType.LOCAL) or not k.use_locals:
        return False
    target = min(threads, r.max_workgroup_threads)
    globals_ = k.axes(AxisType.GLOBAL)
    if not globals_ or not all(isinstance(k.full_shape[a], int) for a in globals_):
        return False
    trial = k.copy()
    if _fill(trial, target) < target // 2:
        trial = k.copy()
        last = len(globals_) - 1
        size = int(k.full_shape[globals_[-1]])
        if size < target:
            return False
        try:
            trial.apply_opt(Opt(OptOps.PADTO, last, target))
        except KernelOptError:
            return False
        if _fill(trial, target) < target // 2:
            return False
    k.__dict__.update(trial.__dict__)
    return True


def _fill(k: Kernel, target: int) -> int:
    """LOCAL splits of the output axes, innermost first, the largest power of two each that divides it and fits in
    `target` threads; returns the threads a workgroup has then."""
    threads = 1
    for n in reversed(range(len(k.axes(AxisType.GLOBAL)))):
        size = k.full_shape[k.axes(AxisType.GLOBAL)[n]]
        amount = target // threads
        while amount > 1 and (not isinstance(size, int) or size % amount or amount > size):
            amount //= 2
        if amount > 1:
            try:
                k.apply_opt(Opt(OptOps.LOCAL, n, amount))
            except KernelOptError:
                continue
            threads *= amount
        if threads >= target:
            break
    return threads
