"""Makes the shared helpers of these tests importable: the suite runs in importlib mode, which puts no test folder
on sys.path. `graph_contract`, the checks every device's graph type must pass, is written once, in
lazygrad-runtime-cuda's tests; it needs only lazygrad-uop, numpy and pytest."""

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent.parent / "runtime-cuda" / "tests"))
