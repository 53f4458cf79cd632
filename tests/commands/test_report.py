"""`slimgrpo report`: plots and the HTML page from a fake run folder, then the page as a browser shows it."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from slimgrpo.config import Config
from slimgrpo.commands.report import report_command
from slimgrpo.report import build_report

NASTY_COMPLETION = "<think>3 & 4 make 7</think><answer>7</answer> <script>alert('x')</script>"
CHAT_PROMPT = [{"role": "system", "content": "Reply with <answer> tags"},
               {"role": "user", "content": "What is 3 + 4? \"quick\" & short"}]


def _metrics(step: int, steps: int) -> dict:
    t = step / steps
    rec = {
        "step": step, "reward": 0.2 + 0.6 * t, "reward_std": 0.3 - 0.1 * t,
        "rewards/accuracy/mean": 0.1 + 0.7 * t, "rewards/accuracy/std": 0.3,
        "rewards/format/mean": 0.5 + 0.4 * t, "rewards/format/std": 0.2,
        "frac_reward_zero_std": 0.25, "loss": 0.01 * (1 - t), "kl": 0.001 * step, "entropy": 2.0 - t,
        "clip_ratio/low_mean": 0.002, "clip_ratio/high_mean": 0.01 * t, "clip_ratio/region_mean": 0.002 + 0.01 * t,
        "completions/mean_length": 30 + 20 * t, "completions/min_length": 12, "completions/max_length": 64,
        "completions/clipped_ratio": 0.125, "grad_norm": 0.5 + 0.1 * step, "learning_rate": 1e-6,
        "update_skipped": False, "gen/tokens_per_s": 850.0 + step, "time/generate_s": 1.5,
        "time/step_s": 2.0, "memory/peak_mib": 1500.0 + step,
    }
    if step == 2:  # undefined values are written as null
        rec.update({"kl": None, "rewards/format/mean": None, "rewards/format/std": None, "grad_norm": None,
                    "update_skipped": True, "reward_faults/format/exception": 2})
    return rec


def make_run(folder: Path, steps: int = 5, summary: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(_metrics(s, steps)) + "\n" for s in range(1, steps + 1)))
    samples = []
    for step in (1, steps):
        for row in range(4):
            samples.append({
                "step": step, "row": row, "prompt": CHAT_PROMPT if row % 2 else "Compute 3 + 4 & explain <briefly>",
                "completion": NASTY_COMPLETION if row == 0 else f"the answer is {row} < 10",
                "reward": 1.5 - row * 0.5, "reward/accuracy": 1.0 if row == 0 else 0.0,
                "reward/format": None if row == 3 else 0.5, "advantage": 1.2 - row * 0.8, "group": row // 2,
            })
    (folder / "completions.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    cfg = Config().to_dict()
    cfg["model"]["path"] = "models/tiny & <small>"
    cfg["loss"]["beta"] = 0.04
    cfg["rewards"]["functions"] = ["accuracy", "format"]
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    if summary:
        (folder / "summary.json").write_text(json.dumps({"steps": steps, "reward": 0.8, "eval_before": 0.12,
                                                         "eval_after": 0.31}))
    return folder


def test_report_writes_plots_and_escaped_page(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    assert report_command(SimpleNamespace(run_dir=str(run))) == 0
    page = run / "report" / "index.html"
    assert capsys.readouterr().out.strip() == str(page)
    text = page.read_text()

    expected = ["reward.png", "reward_functions.png", "kl.png", "loss.png", "completion_length.png", "entropy.png",
                "clip_ratio.png", "fractions.png", "optimizer.png", "throughput.png", "time.png", "memory.png"]
    for name in expected:
        png = run / "report" / name
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f'<img src="{name}"' in text, name

    # model output and run text are escaped, never live markup
    assert "&lt;think&gt;3 &amp; 4 make 7&lt;/think&gt;" in text
    assert "<script>alert" not in text and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in text
    assert "Reply with &lt;answer&gt; tags" in text and "&quot;quick&quot; &amp; short" in text
    assert "<think>" not in text
    # config, summary and per-function rewards are on the page
    assert "loss.beta" in text and "0.04" in text and "models/tiny &amp; &lt;small&gt;" in text
    assert "12.0%" in text and "31.0%" in text
    assert "<th>accuracy</th>" in text and "<th>format</th>" in text and "<th>advantage</th>" in text
    assert "format/exception" in text  # reward faults are summed in the summary


def test_single_step_and_missing_metrics(tmp_path):
    run = tmp_path / "one"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5, "reward_std": None, "kl": None,
                                                   "loss": 0.1}) + "\n")
    page = build_report(run)
    pngs = sorted(p.name for p in (run / "report").glob("*.png"))
    assert pngs == ["loss.png", "reward.png"]  # kl is all null, the rest absent: no empty plots
    text = page.read_text()
    assert "No completions.jsonl" in text and "No config.yaml" in text
    assert "no summary.json yet" in text


def test_truncated_last_line_is_tolerated(tmp_path):
    run = make_run(tmp_path / "run", steps=3, summary=False)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "rew')
    assert build_report(run).is_file()


def test_clear_error_without_metrics(tmp_path):
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "metrics.jsonl"))):
        build_report(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        build_report(tmp_path / "nowhere")
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="no records"):
        build_report(tmp_path)


# ----------------------------------------------------------------------------- in a real browser


def _png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes) into rows of pixels."""
    data = path.read_bytes()
    pos, chunks, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(b"".join(chunks)), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        ftype, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 255
            elif ftype == 2:
                line[i] = (line[i] + b) & 255
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(r[i:i + 3]) for r in rows[::8] for i in range(0, len(r), bpp * 8)]


def _chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("no chromium binary on PATH (apt-get install chromium) to render the report page")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", "--allow-file-access-from-files", f"--user-data-dir={tmp_path / 'chrome-profile'}"]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=120)


def test_page_as_a_browser_shows_it(tmp_path):
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("no chromium binary on PATH (apt-get install chromium) to render the report page")
    run = make_run(tmp_path / "run")
    page = build_report(run)
    # A probe page that loads the report and writes down what the reader sees: every <img> decoded
    # (naturalWidth > 0 means the PNG was found and decoded), and the visible text of a sample cell.
    probe = page.parent / "probe.html"
    probe.write_text(
        '<!DOCTYPE html><html><body><iframe id="f" src="index.html" style="width:1400px;height:900px"></iframe>'
        '<pre id="out">pending</pre><script>'
        'document.getElementById("f").onload = () => {'
        ' const d = document.getElementById("f").contentDocument;'
        ' const imgs = [...d.querySelectorAll("figure img")];'
        ' const cell = [...d.querySelectorAll("table.samples td.text")].map(td => td.innerText).join("\\n");'
        ' document.getElementById("out").textContent = JSON.stringify({'
        '  images: imgs.map(i => [i.getAttribute("src"), i.complete && i.naturalWidth]),'
        '  scripts: d.querySelectorAll("script").length, title: d.title, cells: cell,'
        '  headings: [...d.querySelectorAll("h2")].map(h => h.innerText)});'
        "};</script></body></html>"
    )
    out = _chromium(["--virtual-time-budget=5000", "--dump-dom", probe.as_uri()], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    found = re.search(r'<pre id="out">(.*?)</pre>', out.stdout, re.S)
    assert found and found.group(1) != "pending", out.stdout[-2000:]
    import html as _html

    seen = json.loads(_html.unescape(found.group(1)))
    assert len(seen["images"]) == 12
    assert all(width and width > 100 for _, width in seen["images"]), seen["images"]
    assert seen["scripts"] == 0  # the completion's <script> stayed text
    assert seen["headings"] == ["Summary", "Plots", "Sample completions", "Config"]
    assert NASTY_COMPLETION in seen["cells"]  # shown to the reader exactly as the model wrote it
    assert "Reply with <answer> tags" in seen["cells"]

    shot = tmp_path / "report.png"
    out = _chromium(["--virtual-time-budget=5000", "--window-size=1400,1800", f"--screenshot={shot}",
                     page.as_uri()], tmp_path)
    assert out.returncode == 0 and shot.is_file(), out.stderr[-2000:]
    width, height, pixels = _png_pixels(shot)
    assert (width, height) == (1400, 1800)
    colours = set(pixels)
    dark = sum(1 for p in pixels if sum(p) < 200)
    assert len(colours) > 50, "the screenshot is (nearly) blank"
    assert dark > 100, "no text or plot lines are visible"
