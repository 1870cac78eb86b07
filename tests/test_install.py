"""The wheel installs into a fresh virtualenv with compiler/ and viz/ inside the package."""

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*cmd, **kwargs):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kwargs)


def test_wheel_installs_with_subpackages_inside_the_package(tmp_path):
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", str(dist), str(ROOT))
    (wheel,) = dist.glob("tinygrad_attn-*.whl")

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(_run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                .stdout.strip())
    # The wheel's own files go into the fresh environment; its dependencies (numpy, sympy, ...)
    # come from this test's environment through a path file, so no download is needed.
    _run(sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
         "--target", str(site), str(wheel))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    top_level = {p.name for p in site.iterdir()}
    assert "tinygrad_attn" in top_level
    assert "compiler" not in top_level and "viz" not in top_level

    probe = (
        "import tinygrad_attn as ta, tinygrad_attn.compiler as c, tinygrad_attn.viz as v\n"
        "x = ta.Tensor([1.0, 2.0], requires_grad=True)\n"
        "(x * x).sum().backward()\n"
        "print(ta.__file__, c.__file__, v.__file__, x.grad.numpy().tolist(), sep='\\n')\n"
    )
    out = _run(str(python), "-c", probe, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})
    lines = out.stdout.strip().splitlines()
    for path in lines[:3]:
        assert path.startswith(str(site)), f"imported from {path}, not the fresh environment"
    assert lines[3] == "[2.0, 4.0]"
