"""The wheels the GPU suite carries to the lent machine (``.whl/``, git-ignored), which has no package index.

    python3 -m benchmarks.gpu.wheels pins          # one requirement a line (scripts/fetch_gpu_wheels.sh reads it)
    python3 -m benchmarks.gpu.wheels check [.whl]  # sizes, total with the working tree, against the carry limit

The lent image (the device tool's KINDS.md, read 2026-11-17: Python 3.12.3, torch 2.11.0+cu130, transformers
5.17.0, accelerate 1.15.0, huggingface_hub 1.33.0, peft, pyarrow, pandas, xxhash, fsspec, aiohttp, requests,
httpx, tqdm, pyyaml, rich, psutil, jinja2, packaging, numpy, matplotlib, pytest) lacks exactly these. Each
requirement of each wheel below (its METADATA's Requires-Dist, extras left out) is either in that image or in
this list:

- trl 1.16.0: accelerate, datasets, huggingface_hub, jinja2, numpy, packaging, pandas, psutil, pyarrow, pyyaml,
  transformers;
- datasets 5.2.0: filelock, numpy, pyarrow>=24, dill<0.4.2, pandas, tqdm, xxhash, multiprocess<0.70.20,
  fsspec[http]<=2026.9.0, huggingface-hub>=1.31,<3, packaging, pyyaml;
- multiprocess 0.70.19: dill>=0.4.1 (built for one Python version: the ``py312`` wheel);
- bitsandbytes 0.50.2: torch>=2.4,<3, numpy, packaging;
- torchao 0.18.0: nothing (it loads its C++ kernels only on torch >= 2.11.0, which the image has).

No torch, no project import: the fetch script runs this with any python3.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

LIMIT_MIB = 64.0  # the device tool: the working tree + carried folders of one call
MIB = 2**20


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    file: str  # as PyPI serves it for CPython 3.12, manylinux x86-64
    size: int  # bytes, as downloaded (2026-12)
    why: str

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


WHEELS = (
    Wheel("trl", "1.16.0", "trl-1.16.0-py3-none-any.whl", 948_205,
          "the TRL side of `trl_pair` (GRPOTrainer)"),
    Wheel("datasets", "5.2.0", "datasets-5.2.0-py3-none-any.whl", 608_276, "TRL"),
    Wheel("dill", "0.4.1", "dill-0.4.1-py3-none-any.whl", 120_019, "datasets"),
    Wheel("multiprocess", "0.70.19", "multiprocess-0.70.19-py312-none-any.whl", 150_281,
          "datasets (built for one Python version)"),
    Wheel("torchao", "0.18.0", "torchao-0.18.0-cp310-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
          3_372_585, "bf16 stochastic rounding (`bf16_update`), 8-bit AdamW under FSDP2"),
    Wheel("bitsandbytes", "0.50.2", "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl", 43_139_553,
          "QLoRA (4-bit NF4), 8-bit AdamW: `cuda_tests`, `decode`, `qlora_8b`"),
)


# The lent image's Python packages (the device tool's KINDS.md, "Python packages already there", 2026-11-17), by
# normalized name: what a wheel may require without carrying it.
IMAGE = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax
fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2
joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate
tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(wheel: Path) -> list[str]:
    """The names a wheel requires (its METADATA's Requires-Dist, extras and other platforms' markers left out)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8", errors="replace")
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req, _, marker = line.split(":", 1)[1].partition(";")
        if "extra" in marker or "sys_platform" in marker and "linux" not in marker:
            continue
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        if m:
            out.append(normalize(m.group(1)))
    return out


def unmet(wheel: Path) -> list[str]:
    """What ``wheel`` requires that neither the lent image nor this list provides."""
    listed = {normalize(w.name) for w in WHEELS}
    return [r for r in requirements(wheel) if r not in IMAGE and r not in listed]


def expected(no_bnb: bool = False) -> tuple[Wheel, ...]:
    """The list, without bitsandbytes for ``--no-bnb`` (TRL only)."""
    return tuple(w for w in WHEELS if not (no_bnb and w.name == "bitsandbytes"))


def total_bytes(no_bnb: bool = False) -> int:
    return sum(w.size for w in expected(no_bnb))


def tree_bytes(repo: Path) -> int:
    """Bytes of what a device call sends besides the carried folders: tracked and untracked-not-ignored files."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                         capture_output=True, check=True).stdout
    total = 0
    for name in filter(None, out.split(b"\0")):
        try:
            total += (repo / name.decode()).lstat().st_size
        except OSError:  # deleted in the work tree, not yet in the index
            continue
    return total


def check(folder: Path, repo: Path, no_bnb: bool = False) -> tuple[list[str], bool]:
    """The wheels of ``folder`` against WHEELS: each present with its recorded size, no other wheel, and the
    total with the working tree under LIMIT_MIB. (lines to print, ok)."""
    lines, ok = [], True
    have = {p.name: p.stat().st_size for p in folder.glob("*.whl")} if folder.is_dir() else {}
    for w in expected(no_bnb):
        size = have.pop(w.file, None)
        note = "" if size == w.size else " MISSING" if size is None else f" SIZE DIFFERS (recorded {w.size:,})"
        if size is not None:
            try:
                lacking = unmet(folder / w.file)
            except (OSError, zipfile.BadZipFile, StopIteration) as e:
                lacking = [f"(unreadable: {type(e).__name__})"]
            note += f" REQUIRES {', '.join(lacking)}: neither in the lent image nor in the list" if lacking else ""
        ok &= not note
        lines.append(f"{(size or 0) / MIB:8.2f} MiB  {w.file}{note}")
    for name, size in sorted(have.items()):
        ok = False
        lines.append(f"{size / MIB:8.2f} MiB  {name} NOT IN THE LIST (benchmarks/gpu/wheels.py)")
    wheels = sum(p.stat().st_size for p in folder.glob("*.whl")) if folder.is_dir() else 0
    tree = tree_bytes(repo)
    fits = wheels + tree <= LIMIT_MIB * MIB
    ok &= fits
    lines.append(f"wheels {wheels / MIB:.2f} MiB + working tree {tree / MIB:.2f} MiB = {(wheels + tree) / MIB:.2f} MiB "
                 f"({'under' if fits else 'OVER'} the {LIMIT_MIB:.0f} MiB a device call carries)")
    return lines, ok


def main(argv: list[str]) -> int:
    no_bnb = "--no-bnb" in argv
    args = [a for a in argv if a != "--no-bnb"]
    if args[:1] == ["pins"]:
        print("\n".join(w.pin for w in expected(no_bnb)))
        return 0
    if args[:1] == ["check"]:
        repo = Path(__file__).resolve().parents[2]
        lines, ok = check(Path(args[1]) if len(args) > 1 else repo / ".whl", repo, no_bnb)
        print("\n".join(lines))
        return 0 if ok else 1
    print(__doc__.splitlines()[0], "\nusage: python3 -m benchmarks.gpu.wheels pins | check [FOLDER] [--no-bnb]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
