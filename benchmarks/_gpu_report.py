"""The markdown report of benchmarks/gpu_suite.py: the goals first, then one table per section."""

from __future__ import annotations

from typing import Any

GOAL_RATIO = 0.15
GIB = 1024.0  # MiB per GiB


def _f(x: Any, spec: str = "{:,.0f}") -> str:
    if x is None or x == "":
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        return spec.format(x)
    return str(x)


def _within(ratio: float | None) -> str:
    return "-" if ratio is None else ("yes" if abs(ratio - 1) <= GOAL_RATIO else "no")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def goals(report: dict) -> list[str]:
    if report.get("smoke"):
        return ["Smoke run (tiny shapes): the goals are not evaluated and no figure here is a result."]
    s = report["sections"]
    ratios = [r.get("ratio") for key in ("planner", "update_only_long", "quantized")
              for r in s.get(key, {}).get("rows", []) if r.get("ratio")]
    plan = ("not measured" if not ratios else
            f"{sum(abs(x - 1) <= GOAL_RATIO for x in ratios)} of {len(ratios)} runs within ±15% "
            f"(plan/peak {min(ratios):.2f} to {max(ratios):.2f})")
    trl = [r for r in s.get("vs_trl", {}).get("rows", []) if r.get("vram_ratio")]
    vs = ("not measured" if not trl else "; ".join(
        f"{r['name']}: VRAM {r['vram_ratio']:.2f}x of TRL ({'met' if r['vram_ratio'] <= 1 / 3 else 'not met'}), "
        f"s/step {_f(r.get('time_ratio'), '{:.2f}x')}" for r in trl))
    long_rows = [r for r in s.get("update_only_long", {}).get("rows", []) if r.get("peak_alloc_mib")]
    long = ("not measured" if not long_rows else "; ".join(
        f"{r['name']}: {r['peak_alloc_mib'] / GIB:.1f} GiB ({'met' if r['peak_alloc_mib'] < 48 * GIB else 'not met'})"
        for r in long_rows))
    ro = [r for r in s.get("rollout", {}).get("rows", []) if r.get("engine", "").startswith("slimgrpo")]
    roll = ("not measured" if not ro else "; ".join(
        f"{r['engine']}: {r['speedup_vs_hf']:.1f}x HF generate ({'met' if r['speedup_vs_hf'] >= 10 else 'not met'})"
        for r in ro))
    return _table(["goal", "result"], [
        ["plan within ±15% of CUDA peak on every run", plan],
        ["slimgrpo peak VRAM ≤ 1/3 of TRL's (Oxen settings), s/step ≤ TRL's", vs],
        ["8B / 20K / 8-completion LoRA update under 48 GiB", long],
        ["rollout ≥ 10x HF generate", roll],
    ])


def markdown(report: dict) -> str:
    s = report["sections"]
    env = (s.get("env", {}).get("rows") or [{}])[0]
    lines = [f"# slimgrpo GPU suite{' (smoke)' if report.get('smoke') else ''}", "",
             f"Device: {s.get('env', {}).get('line', '-')}", "",
             "Versions: " + ", ".join(f"{k} {env.get(k)}" for k in
                                      ("transformers", "peft", "accelerate", "trl", "datasets", "bitsandbytes")
                                      if k in env),
             f"Started {report.get('started')}, {report.get('elapsed_s', '-')} s in all "
             f"(limit {report.get('time_limit_s')} s).", "", "## Goals", "", *goals(report)]
    for name, title, render in SECTIONS:
        sec = s.get(name, {})
        lines += ["", f"## {title}", "",
                  f"Status: {sec.get('status', 'not run')}; {sec.get('seconds', 0)} s (budget {sec.get('budget_s', '-')} s)", ""]
        if sec.get("rows"):
            lines += render(sec["rows"])
    return "\n".join(lines) + "\n"


def _env(rows):
    return _table(["key", "value"], [[k, _f(v)] for k, v in rows[0].items()])


def _cuda_tests(rows):
    r = rows[0]
    out = _table(["passed", "failed", "skipped", "errors", "deselected"],
                 [[str(r.get(k, 0)) for k in ("passed", "failed", "skipped", "error", "deselected")]])
    return out + ([""] + [f"- `{p}`" for p in r.get("problems", [])] if r.get("problems") else [])


def _loss(rows):
    return _table(["path", "tokens", "vocab", "dtype", "s fwd+bwd", "extra peak MiB", "max |Δ logp|", "rel. Δ grad W"],
                  [[r["path"], _f(r["tokens"]), _f(r["vocab"]), r["dtype"], _f(r["s_fwd_bwd"], "{:.4f}"),
                    _f(r["extra_peak_mib"]), _f(r["max_abs_logp_diff"], "{:.2e}"),
                    _f(r["max_rel_grad_w_diff"], "{:.2e}")] for r in rows])


def _plan_rows(rows, time_key, time_name):
    return _table(["run", "plan MiB (tensors)", "peak alloc MiB", "peak reserved MiB", "plan/peak", "within ±15%",
                   time_name, "status"],
                  [[r["name"], _f(r.get("plan_mib")), _f(r.get("peak_alloc_mib")), _f(r.get("peak_reserved_mib")),
                    _f(r.get("ratio"), "{:.2f}"), _within(r.get("ratio")), _f(r.get(time_key), "{:.2f}"),
                    r.get("status", "-")] for r in rows])


UPDATE_NOTE = ("Update only (synthetic completions, no generation): plan = the plan's always + update phases "
               "without framework overhead, against `torch.cuda.max_memory_allocated`.")


def _long(rows):
    return _plan_rows(rows, "s_per_update", "s/update") + ["", UPDATE_NOTE]


def _long_context(rows):
    rows = [r for r in rows if r.get("name") != "random base saved" or not str(r.get("status", "")).startswith("ok")]
    return _table(["run", "tokens", "plan MiB", "peak alloc MiB", "peak reserved MiB", "plan/peak", "host plan MiB",
                   "s/update", "status"],
                  [[r["name"], _f(r.get("tokens")), _f(r.get("plan_mib")), _f(r.get("peak_alloc_mib")),
                    _f(r.get("peak_reserved_mib")), _f(r.get("ratio"), "{:.2f}"), _f(r.get("plan_host_mib")),
                    _f(r.get("s_per_update"), "{:.2f}"), r.get("status", "-")] for r in rows]) + [
        "", "Issue 29's rows (docs/benchmarks.md#anchors-simulated) measured: update only on synthetic "
            "completions, random weights; the trace's device estimate adds the CUDA context and a 10% margin "
            "to the plan."]


def _quantized(rows):
    return _table(["run", "optimizer", "finite", "plan MiB", "peak alloc MiB", "plan/peak", "s/update", "status"],
                  [[r["name"], r.get("optimizer", "-"), _f(r.get("finite")), _f(r.get("plan_mib")),
                    _f(r.get("peak_alloc_mib")), _f(r.get("ratio"), "{:.2f}"), _f(r.get("s_per_update"), "{:.2f}"),
                    r.get("status", "-")] for r in rows]) + ["", UPDATE_NOTE]


def _rollout(rows):
    return _table(["engine", "rows", "prompt", "new tokens", "s", "tokens/s", "x HF generate"],
                  [[r["engine"], _f(r["rows"]), _f(r["prompt"]), _f(r["new_tokens"]), _f(r["seconds"], "{:.2f}"),
                    _f(r["tokens_per_s"], "{:,.1f}"), _f(r["speedup_vs_hf"], "{:.2f}")] for r in rows])


def _planner(rows):
    out = _plan_rows(rows, "s_per_step", "s/step")
    return out + ["", "s/step: the last step of a run (generate pinned completions + update); the runs paired "
                      "with TRL take two steps, the others one (warm-up included). Plan: "
                      "`MemoryPlan.tensor_peak_bytes` (no CUDA context)."]


def _vs_trl(rows):
    return _table(["run", "slimgrpo peak MiB", "TRL peak MiB", "VRAM slimgrpo/TRL", "≤ 1/3", "slimgrpo s/step",
                   "TRL s/step", "time slimgrpo/TRL", "status"],
                  [[r["name"], _f(r.get("slim_peak_alloc_mib")), _f(r.get("trl_peak_alloc_mib")),
                    _f(r.get("vram_ratio"), "{:.2f}"),
                    "-" if r.get("vram_ratio") is None else ("yes" if r["vram_ratio"] <= 1 / 3 else "no"),
                    _f(r.get("slim_s_per_step"), "{:.2f}"), _f(r.get("trl_s_per_step"), "{:.2f}"),
                    _f(r.get("time_ratio"), "{:.2f}"), r.get("status", "-")] for r in rows])


SECTIONS = [
    ("env", "Environment", _env),
    ("cuda_tests", "CUDA tests (pytest -m cuda)", _cuda_tests),
    ("loss", "Chunked loss vs naive (forward + backward)", _loss),
    ("update_only_long", "Update-only long context (synthetic completions)", _long),
    ("quantized", "QLoRA and bitsandbytes 8-bit AdamW", _quantized),
    ("rollout", "Rollout tokens/s vs HF generate", _rollout),
    ("planner", "Planner vs torch.cuda.max_memory_allocated (full steps)", _planner),
    ("vs_trl", "slimgrpo vs TRL 1.16 (same settings)", _vs_trl),
    ("long_context", "Longest context: Qwen3-8B QLoRA (issue 29)", _long_context),
]
