"""Makes `mpi_worker` (the script the MPI tests launch, whose training the tests also run in this process)
importable: the suite runs in importlib mode, which puts no test folder on sys.path."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
