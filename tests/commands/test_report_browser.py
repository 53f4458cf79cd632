"""The report page in a real browser (headless Chromium driven by Selenium, 1400 px wide): no two tables or
figures overlap, nothing runs off the page, every image decodes. Skipped only when Chromium is missing."""

import json
import shutil
from pathlib import Path

import pytest
import yaml
from test_report import make_run

from slimgrpo.report import build_comparison, build_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("Chromium and chromedriver are not installed (Debian: apt-get install -y chromium "
                    "chromium-driver; .ci/run does it): the report's layout is not checked in a browser")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1000", "--force-device-scale-factor=1", "--hide-scrollbars"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def rich_run(folder: Path, steps: int = 60, name_suffix: str = "") -> Path:
    """A run with three reward functions, held-out evals, long config values and a logged conversation."""
    run = make_run(folder, steps=steps)
    records = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        r["rewards/a_rather_long_reward_function_name/mean"] = 0.1 + 0.5 * r["step"] / steps
        r["rewards/a_rather_long_reward_function_name/std"] = 0.4
        if r["step"] % 20 == 0 or r["step"] == steps:
            r.update({"eval/accuracy_greedy": 0.2 + 0.4 * r["step"] / steps, "eval/accuracy_sampled": 0.1 + 0.3 *
                      r["step"] / steps, "eval/pass@4": 0.5})
    records.insert(0, {"step": 0, "eval/accuracy_greedy": 0.2, "eval/accuracy_sampled": 0.1, "eval/pass@4": 0.4})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"]["path"] = "/very/long/path/" + "nested-folder-name/" * 12 + "prompts.jsonl"
    cfg["rewards"]["functions"] = ["accuracy", "format", "my_rewards_with_a_long_module_name.py:"
                                   + "a_rather_long_reward_function_name" + name_suffix]
    cfg["rewards"]["reward_weights"] = [1.0, 0.25, 0.125]
    cfg["log"]["report_to"] = ["tensorboard", "wandb", "mlflow", "trackio"]
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    conversation = [{"role": "system", "content": "You are a calculator."},
                    {"role": "user", "content": "What is 3 + 4?"},
                    {"role": "assistant", "content": None, "tool_calls": [{"name": "add", "arguments": {"a": 3}}]},
                    {"role": "tool", "content": "7"}, {"role": "assistant", "content": "The answer is 7."}]
    with (run / "completions.jsonl").open("a") as f:
        f.write(json.dumps({"step": steps, "row": 9, "prompt": conversation[:2], "completion": conversation[2:],
                            "reward": 1.0, "advantage": 0.5, "group": 4}) + "\n")
    return run


LAYOUT_PROBE = """
for (const d of document.querySelectorAll('details')) d.open = true;
const boxes = [...document.querySelectorAll('table, figure')].filter(e => e.offsetParent !== null).map(e => {
  const r = e.getBoundingClientRect();
  return {tag: e.tagName + (e.className ? '.' + e.className : ''), text: e.innerText.slice(0, 40),
          x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height,
          scroll: !!e.closest('.scroll')};
});
const imgs = [...document.images].map(i => [i.getAttribute('src'), i.complete, i.naturalWidth, i.naturalHeight,
                                            i.getBoundingClientRect().width]);
return {boxes, imgs, pageWidth: document.documentElement.scrollWidth, viewport: innerWidth};
"""


def _overlaps(boxes):
    bad = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            ix = min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"])
            iy = min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"])
            if ix > 1 and iy > 1:
                bad.append((a["tag"], a["text"], b["tag"], b["text"]))
    return bad


def _check_page(browser, page: Path, min_images: int):
    browser.get(page.resolve().as_uri())
    browser.execute_script("return document.readyState")
    seen = browser.execute_script(LAYOUT_PROBE)
    assert len(seen["boxes"]) >= 3
    assert _overlaps(seen["boxes"]) == []
    assert seen["pageWidth"] <= seen["viewport"] <= 1400, "something runs off the 1400 px page"
    for b in seen["boxes"]:
        if not b["scroll"]:
            assert b["x"] + b["w"] <= seen["viewport"] + 1, b
    assert len(seen["imgs"]) >= min_images
    for src, complete, natural_w, natural_h, shown_w in seen["imgs"]:
        assert complete and natural_w > 0 and natural_h > 0, src  # found and decoded
        assert natural_w >= 1.9 * shown_w, (src, natural_w, shown_w)  # 2x pixels for HiDPI screens
    return seen


def test_report_page_layout_in_chromium(browser, tmp_path):
    run = rich_run(tmp_path / "run")
    page = build_report(run)
    _check_page(browser, page, min_images=12)
    text = browser.find_element("tag name", "body").text
    assert "Complete: 60 of 100 steps." not in text  # max_steps 100 in the config, summary says 60
    assert "held-out accuracy, greedy" in text and "TOOL" in text and "The answer is 7." in text


def test_comparison_page_layout_in_chromium(browser, tmp_path):
    a, b = rich_run(tmp_path / "lr-1e-5"), rich_run(tmp_path / "lr-3e-5", steps=40, name_suffix="_v2")
    page = build_comparison([str(a), str(b)], str(tmp_path / "cmp"))
    _check_page(browser, page, min_images=10)
    text = browser.find_element("tag name", "body").text
    assert "lr-1e-5" in text and "lr-3e-5" in text and "rewards.functions" in text
