"""The markdown report of the GPU suite (suite.py): the goals first, then one table per section."""

from __future__ import annotations

from typing import Any

from benchmarks.harness.tables import markdown_table as table

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


def goals(report: dict) -> list[str]:
    if report.get("dry_run"):
        return ["Dry run (CPU, no CUDA work): the goals are not evaluated and no figure here is a measurement."]
    if report.get("smoke"):
        return ["Smoke run (tiny shapes): the goals are not evaluated and no figure here is a result."]
    s = report["sections"]
    ratios = [r.get("ratio") for key in ("train_e2e", "memory", "qlora_8b", "planner", "update_only_long", "quantized")
              for r in s.get(key, {}).get("rows", []) if r.get("ratio")]
    plan = ("not measured" if not ratios else
            f"{sum(abs(x - 1) <= GOAL_RATIO for x in ratios)} of {len(ratios)} runs within ±15% "
            f"(plan/peak {min(ratios):.2f} to {max(ratios):.2f})")
    trl = [r for key in ("trl_pair", "vs_trl") for r in s.get(key, {}).get("rows", []) if r.get("vram_ratio")]
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
    return table(["goal", "result"], [
        ["plan within ±15% of CUDA peak on every run", plan],
        ["slimgrpo peak VRAM ≤ 1/3 of TRL's (Oxen settings), s/step ≤ TRL's", vs],
        ["8B / 20K / 8-completion LoRA update under 48 GiB", long],
        ["rollout ≥ 10x HF generate", roll],
    ])


def markdown(report: dict) -> str:
    s = report["sections"]
    setup = s.get("setup", {})
    mods = setup.get("probe", {}).get("modules", {})
    title = " (dry run)" if report.get("dry_run") else " (smoke)" if report.get("smoke") else ""
    call = report.get("call")
    lines = [f"# slimgrpo GPU suite{title}" + (f": the {call} call" if call in ("first", "second") else ""), "",
             f"Device: {setup.get('line', '-')}", "",
             "Versions: " + (", ".join(f"{k} {m.get('version') if m.get('ok') else 'not importable'}"
                                       for k, m in mods.items()) or "-"), "",
             f"Started {report.get('started')}, {report.get('elapsed_s', '-')} s in all "
             f"(limit {report.get('time_limit_s')} s); order: {', '.join(report.get('order', []))}.", ""]
    if report.get("stopped") or report.get("driver_error"):
        lines += [f"**Stopped early**: {report.get('stopped') or report.get('driver_error')}", ""]
    if report.get("next_call"):
        lines += ["**Next**: the second call (its own budget), at once while the machine is warm:", "",
                  f"    {report['next_call']}", ""]
    lines += ["| section | status | s | budget s |", "|---|---|---:|---:|"]
    lines += [f"| {name} | {str(s.get(name, {}).get('status', '-'))[:160]} | {s.get(name, {}).get('seconds', 0)} | "
              f"{s.get(name, {}).get('budget_s', '-')} |" for name, _, _ in SECTIONS
              if not str(s.get(name, {}).get("status", "")).startswith("skipped: not selected")]
    lines += ["", "## Goals", "", *goals(report)]
    for name, title, render in SECTIONS:
        sec = s.get(name, {})
        lines += ["", f"## {title}", "",
                  f"Status: {sec.get('status', 'not run')}; {sec.get('seconds', 0)} s (budget {sec.get('budget_s', '-')} s)", ""]
        if len(sec.get("tasks", [])) > 1 or any(not str(t.get("status", "")).startswith("ok") for t in sec.get("tasks", [])):
            lines += table(["task", "status", "s", "limit s"],
                           [[t.get("task", "-"), str(t.get("status", "-"))[:200], _f(t.get("seconds"), "{:.1f}"),
                             _f(t.get("limit_s"), "{:.0f}")] for t in sec["tasks"]]) + [""]
        if name == "setup" or sec.get("rows"):
            try:
                lines += render(sec["rows"]) if name != "setup" else render(sec)
            except Exception as e:  # one odd row must not cost the rest of the report
                lines += [f"(rows not rendered: {type(e).__name__}: {e}; see gpu_suite.json)"]
    return "\n".join(lines) + "\n"


def _setup(sec):
    out = table(["wheel", "version", "had", "status", "s"],
                [[r.get("wheel", "-"), _f(r.get("version")), _f(r.get("had")), str(r.get("status", "-")),
                  _f(r.get("seconds"), "{:.1f}")] for r in sec.get("rows", [])])
    probe = sec.get("probe", {})
    if probe.get("error"):
        out += ["", f"Import probe: {probe['error']}"]
    mods = probe.get("modules", {})
    if mods:
        out += [""] + table(["module", "importable", "version or error", "import s"],
                            [[k, _f(m.get("ok")), str(m.get("version") if m.get("ok") else m.get("error")),
                              _f(m.get("s"), "{:.1f}")] for k, m in mods.items()])
    return out


def _generic(rows):
    """Rows of a script's JSON (update/bf16_update.py, rollout/decode_graphs.py): its scalar fields as columns."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k, v in r.items() if k not in keys and not isinstance(v, (dict, list))]
    keys = keys[:14]
    return table(keys, [[_f(r.get(k), "{:,.4g}") for k in keys] for r in rows])


def _train(rows):
    return table(["run", "status", "exit", "steps", "train s", "plan MiB", "peak alloc MiB", "plan/peak",
                  "memory/peak_mib", "peak reserved MiB", "plan + overhead MiB", "pinned peak MiB", "plan host MiB",
                  "completions clipped (per step)", "checkpoints"],
                 [[r.get("name", "-"), str(r.get("status", "-"))[:120], _f(r.get("exit_code")),
                   _f(r.get("last_step")), _f(r.get("train_s"), "{:.1f}"), _f(r.get("plan_mib"), "{:,.1f}"),
                   _f(r.get("peak_alloc_mib"), "{:,.1f}"), _f(r.get("ratio"), "{:.2f}"),
                   _f(r.get("metric_peak_mib"), "{:,.1f}"), _f(r.get("peak_reserved_mib"), "{:,.1f}"), _f(r.get("plan_with_overhead_mib"), "{:,.1f}"),
                   _f(r.get("pinned_peak_mib"), "{:,.1f}"), _f(r.get("plan_host_mib"), "{:,.1f}"),
                   ", ".join(_f(c, "{:.2f}") for c in r.get("clipped_ratio") or []) or "-",
                   ", ".join(r.get("checkpoints") or []) or "-"] for r in rows]) + [
        "", "Peaks of the training process (`torch.cuda.max_memory_allocated` / `max_memory_reserved`; pinned: "
            "`torch.cuda.host_memory_stats()` `allocated_bytes.peak` plus the bytes slimgrpo pinned in place, "
            "`memory/pinned.py`) against "
            "the plan of the same config (`slimgrpo plan` numbers: tensors; tensors + CUDA context; host line); "
            "`memory/peak_mib`: the run's own metric (CUDA peak allocated; peak RSS on a CPU). "
            "A clipped ratio under 1 means some completions stopped at EOS."]


def _memory(rows):
    return table(["run", "allocator", "plan MiB", "peak alloc MiB", "plan/peak", "within ±15%", "peak reserved MiB",
                  "reserved/alloc", "pinned peak MiB", "plan host MiB", "s", "status"],
                 [[r.get("name", "-"), r.get("allocator", "-"), _f(r.get("plan_mib")), _f(r.get("peak_alloc_mib")),
                   _f(r.get("ratio"), "{:.2f}"), _within(r.get("ratio")), _f(r.get("peak_reserved_mib")),
                   _f(r.get("reserved_over_alloc"), "{:.3f}"), _f(r.get("pinned_peak_mib")),
                   _f(r.get("plan_host_mib")), _f(r.get("s_per_step") or r.get("s_per_update"), "{:.2f}"),
                   str(r.get("status", "-"))[:160]] for r in rows]) + [
        "", "Oxen rows: full steps (generate 4 x 786 pinned tokens for a 256-token prompt + the update), plan = "
            "`MemoryPlan.tensor_peak_bytes`; the full row twice, with the default allocator and with "
            "`expandable_segments` (reserved / allocated)."]


def _qlora_8b(rows):
    return table(["run", "plan MiB", "peak alloc MiB", "plan/peak", "within ±15%", "peak reserved MiB",
                  "pinned peak MiB", "plan host MiB", "host plan/peak", "s/update", "save s", "status"],
                 [[r.get("name", "-"), _f(r.get("plan_mib")), _f(r.get("peak_alloc_mib")), _f(r.get("ratio"), "{:.2f}"),
                   _within(r.get("ratio")), _f(r.get("peak_reserved_mib")), _f(r.get("pinned_peak_mib")),
                   _f(r.get("plan_host_mib")), _f(r.get("host_ratio"), "{:.2f}"), _f(r.get("s_per_update"), "{:.1f}"),
                   _f(r.get("save_s"), "{:.1f}"), str(r.get("status", "-"))[:160]] for r in rows]) + [
        "", "Update only on synthetic completions, random weights (a bf16 base saved once, loaded in 4-bit NF4): "
            "plan = the plan's always + update phases against `torch.cuda.max_memory_allocated`; pinned host bytes: "
            "`torch.cuda.host_memory_stats()` plus the offload pool's bytes pinned in place, against the plan's "
            "host line."]


def _cuda_tests(rows):
    r = rows[0]
    out = table(["collected", "passed", "failed", "skipped", "errors", "deselected", "not started"],
                [[_f(r.get(k)) for k in ("collected", "passed", "failed", "skipped", "error", "deselected",
                                          "not_started")]])
    if r.get("tests"):
        out += [""] + table(["test", "outcome", "s", "message"],
                            [[f"`{t['test']}`", t["outcome"], _f(t.get("s"), "{:.1f}"),
                              str(t.get("message") or "")[:200]] for t in r["tests"]])
    if r.get("running"):
        out += ["", f"Stopped at the limit inside `{r['running']}`; the tests after it did not start."]
    out += ["", f"Per-test results from: {r.get('source', '-')}"
                + (f"; JUnit XML: `{r['junit']}` (beside this report)" if r.get("junit") else "; no JUnit XML "
                   "(pytest was stopped before it ended)" if r.get("returncode") is None else "")]
    return out + ([""] + [f"- `{p}`" for p in r.get("problems", [])] if r.get("problems") else [])


def _loss(rows):
    return table(["path", "tokens", "vocab", "dtype", "s fwd+bwd", "extra peak MiB", "max |Δ logp|", "rel. Δ grad W"],
                 [[r["path"], _f(r["tokens"]), _f(r["vocab"]), r["dtype"], _f(r["s_fwd_bwd"], "{:.4f}"),
                   _f(r["extra_peak_mib"]), _f(r["max_abs_logp_diff"], "{:.2e}"),
                   _f(r["max_rel_grad_w_diff"], "{:.2e}")] for r in rows])


def _plan_rows(rows, time_key, time_name):
    return table(["run", "plan MiB (tensors)", "peak alloc MiB", "peak reserved MiB", "plan/peak", "within ±15%",
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
    return table(["run", "tokens", "plan MiB", "peak alloc MiB", "peak reserved MiB", "plan/peak", "host plan MiB",
                  "s/update", "status"],
                 [[r["name"], _f(r.get("tokens")), _f(r.get("plan_mib")), _f(r.get("peak_alloc_mib")),
                   _f(r.get("peak_reserved_mib")), _f(r.get("ratio"), "{:.2f}"), _f(r.get("plan_host_mib")),
                   _f(r.get("s_per_update"), "{:.2f}"), r.get("status", "-")] for r in rows]) + [
        "", "Issue 29's rows (docs/benchmarks.md#anchors-simulated) measured: update only on synthetic "
            "completions, random weights; the trace's device estimate adds the CUDA context and a 10% margin "
            "to the plan."]


def _quantized(rows):
    return table(["run", "optimizer", "finite", "plan MiB", "peak alloc MiB", "plan/peak", "s/update", "status"],
                 [[r["name"], r.get("optimizer", "-"), _f(r.get("finite")), _f(r.get("plan_mib")),
                   _f(r.get("peak_alloc_mib")), _f(r.get("ratio"), "{:.2f}"), _f(r.get("s_per_update"), "{:.2f}"),
                   r.get("status", "-")] for r in rows]) + ["", UPDATE_NOTE]


def _rollout(rows):
    return table(["engine", "rows", "prompt", "new tokens", "s", "tokens/s", "x HF generate"],
                 [[r["engine"], _f(r["rows"]), _f(r["prompt"]), _f(r["new_tokens"]), _f(r["seconds"], "{:.2f}"),
                   _f(r["tokens_per_s"], "{:,.1f}"), _f(r["speedup_vs_hf"], "{:.2f}")] for r in rows])


def _planner(rows):
    out = _plan_rows(rows, "s_per_step", "s/step")
    return out + ["", "s/step: the last step of a run (generate pinned completions + update); the runs paired "
                      "with TRL take two steps, the others one (warm-up included). Plan: "
                      "`MemoryPlan.tensor_peak_bytes` (no CUDA context)."]


def _vs_trl(rows):
    return table(["run", "slimgrpo peak MiB", "TRL peak MiB", "VRAM slimgrpo/TRL", "≤ 1/3", "slimgrpo s/step",
                  "TRL s/step", "time slimgrpo/TRL", "status"],
                 [[r["name"], _f(r.get("slim_peak_alloc_mib")), _f(r.get("trl_peak_alloc_mib")),
                   _f(r.get("vram_ratio"), "{:.2f}"),
                   "-" if r.get("vram_ratio") is None else ("yes" if r["vram_ratio"] <= 1 / 3 else "no"),
                   _f(r.get("slim_s_per_step"), "{:.2f}"), _f(r.get("trl_s_per_step"), "{:.2f}"),
                   _f(r.get("time_ratio"), "{:.2f}"), r.get("status", "-")] for r in rows])


SECTIONS = [
    ("setup", "Setup: wheels and imports", _setup),
    ("cuda_tests", "(a) CUDA tests (pytest -m cuda, their files only)", _cuda_tests),
    ("train_e2e", "(b) slimgrpo train end to end, then resumed", _train),
    ("bf16_update", "(c) bf16 full fine-tuning: does the update land", _generic),
    ("decode", "(d) Decode: eager vs CUDA graphs, LoRA and QLoRA", _generic),
    ("memory", "(e) Memory against the plan", _memory),
    ("trl_pair", "(f) slimgrpo vs TRL 1.16 on the 0.5B pair", _vs_trl),
    ("qlora_8b", "(g) Qwen3-8B QLoRA, the 24 GB row (the second call)", _qlora_8b),
    ("loss", "Chunked loss vs naive (forward + backward)", _loss),
    ("update_only_long", "Update-only long context (synthetic completions)", _long),
    ("quantized", "QLoRA and bitsandbytes 8-bit AdamW", _quantized),
    ("rollout", "Rollout tokens/s vs HF generate", _rollout),
    ("planner", "Planner vs torch.cuda.max_memory_allocated (full steps)", _planner),
    ("vs_trl", "slimgrpo vs TRL 1.16 (same settings)", _vs_trl),
    ("long_context", "Longest context: Qwen3-8B QLoRA (issue 29)", _long_context),
]
