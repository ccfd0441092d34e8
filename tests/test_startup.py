"""`msa --help` stays instant: the command line module does not import torch."""

import subprocess
import sys


def test_cli_module_imports_without_torch():
    code = "import sys, msa.app; print('torch' in sys.modules, 'msa.kernels' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False", "False"]
