"""Built-in reward functions, the spec loader and the reward runner."""

from __future__ import annotations

import math
import sys
import textwrap
import threading
import time

import pytest
import torch

from slimgrpo.rewards import (
    BUILTIN_REWARDS,
    RewardFileNotFoundError,
    RewardFunctionError,
    RewardRunner,
    RewardSpecError,
    boxed_accuracy,
    code_execution_reward,
    completion_text,
    extract_code_block,
    format_lenient,
    format_strict,
    gsm8k_accuracy,
    load_reward_function,
    load_reward_functions,
    make_format_reward,
    make_length_reward,
    normalize_number,
)
from slimgrpo.rewards.answers import last_boxed, last_number, model_answer
from slimgrpo.containers import RewardOutput

# ------------------------------------------------------------------------------ number parsing


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1,234", "1234"),
        ("$18", "18"),
        ("18.00", "18"),
        ("18.0", "18"),
        ("+5", "5"),
        ("-3", "-3"),
        ("\u22123", "-3"),
        ("-0", "0"),
        ("50%", "50"),
        ("\\$1,234.50", "1234.5"),
        ("18 dollars", "18"),
        ("12 cm.", "12"),
        ("x = 7", "7"),
        ("3/4", "0.75"),
        ("0.75", "0.75"),
        ("\\frac{3}{4}", "0.75"),
        ("\\dfrac12", "0.5"),
        ("1/3", "1/3"),
        ("1e3", "1000"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        (".5", "0.5"),
        ("1,5", None),
        ("1/0", None),
        ("abc", None),
        ("", None),
        ("3 and 4", None),
    ],
)
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


def test_last_number_and_boxed():
    assert last_number("5-3 = 2 apples and 1,234 pears.") == "1,234"
    assert last_number("x=-3") == "-3"
    assert last_number("48/2 = 24") == "24"
    assert last_number("no numbers") is None
    assert last_boxed(r"\boxed{1} then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{1} then \boxed{unclosed") == "1"
    assert model_answer("<answer></answer> 42") == ""  # an answer tag wins even when empty


def test_completion_text_conversational():
    messages = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert completion_text(messages) == "ab"
    assert completion_text([{"role": "assistant", "content": "x"}]) == "x"
    assert completion_text("plain") == "plain"


# ------------------------------------------------------------------------------- gsm8k_accuracy

GSM8K_CASES = [
    # (completion, gold answer column, expected)
    ("The answer is 1234", "so ... #### 1,234", 1.0),
    ("The answer is 1,234.", "#### 1234", 1.0),
    ("She makes $18 every day.", "#### 18", 1.0),
    ("Total: 18.00", "18", 1.0),
    ("It drops by -3 degrees", "#### -3", 1.0),
    ("It is 50%", "#### 50", 1.0),
    ("<think>3 + 4 = 7, maybe 9</think>\n<answer>\n7\n</answer>", "#### 7", 1.0),
    ("<answer>The total is 18 dollars.</answer> and later 99", "#### 18", 1.0),
    ("First 12, then 30, finally 42", "#### 42", 1.0),
    ("First 42, then 30", "#### 42", 0.0),  # the last number wins
    ("We get \\boxed{72}. Check: 72 - 1 = 71", "#### 72", 1.0),
    ("blah\n#### 5\nextra 6", "#### 5", 1.0),
    ("3/4 of the cake", "#### 0.75", 1.0),
    ("I don't know", "#### 7", 0.0),
    ("", "#### 7", 0.0),
    ("<answer></answer>7", "#### 7", 0.0),
]


@pytest.mark.parametrize("completion, gold, expected", GSM8K_CASES)
def test_gsm8k_accuracy(completion, gold, expected):
    assert gsm8k_accuracy(["q"], [completion], answer=[gold]) == [expected]


def test_gsm8k_conversational_and_missing_gold():
    completions = [[{"role": "assistant", "content": "<answer>10</answer>"}], "10"]
    prompts = [[{"role": "user", "content": "q"}]] * 2
    assert gsm8k_accuracy(prompts, completions, answer=["#### 10", None]) == [1.0, None]
    with pytest.raises(ValueError, match="answer"):
        gsm8k_accuracy(["q"], ["1"])
    with pytest.raises(ValueError, match="2 values for 1"):
        gsm8k_accuracy(["q"], ["1"], answer=["1", "2"])


# ------------------------------------------------------------------------------- boxed_accuracy

BOXED_CASES = [
    ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("so \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{1} no wait \\boxed{2}", "2", 1.0),
    ("\\boxed{1,234}", "1234", 1.0),
    ("\\boxed{x^2 + 1}", "x^{2}+1", 0.0),  # only light string normalisation
    ("\\boxed{ x^2 + 1 }", "x^2+1", 1.0),
    ("\\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", 1.0),
    ("\\boxed{\\text{(B)}}", "(b)", 1.0),
    ("the answer is 2", "2", 0.0),  # no box
    ("\\boxed{3}", "solution ... \\boxed{3}.", 1.0),  # gold with a box
]


@pytest.mark.parametrize("completion, gold, expected", BOXED_CASES)
def test_boxed_accuracy(completion, gold, expected):
    assert boxed_accuracy(["q"], [completion], answer=[gold]) == [expected]


# ---------------------------------------------------------------------------------------- format

FORMAT_CASES = [
    # (completion, strict, lenient)
    ("<think>\nreason\n</think>\n<answer>\n42\n</answer>", 1.0, 1.0),
    ("  <think>\nmulti\nline\n</think>\n<answer>\n42\n</answer>\n\n", 1.0, 1.0),
    ("<think>reason</think><answer>42</answer>", 0.0, 1.0),
    ("preamble <think>\nr\n</think>\n<answer>\n4\n</answer>", 0.0, 1.0),
    ("<think>\nr\n</think>\n<answer>\n4\n</answer>\n<answer>\n5\n</answer>", 0.0, 1.0),
    ("<answer>\n4\n</answer>\n<think>\nr\n</think>", 0.0, 0.0),
    ("<think>\nr\n</think>\n", 0.0, 0.0),
    ("just text", 0.0, 0.0),
]


@pytest.mark.parametrize("completion, strict, lenient", FORMAT_CASES)
def test_format_rewards(completion, strict, lenient):
    assert format_strict(["q"], [completion]) == [strict]
    assert format_lenient(["q"], [completion]) == [lenient]
    conversational = [[{"role": "assistant", "content": completion}]]
    assert format_strict(["q"], conversational) == [strict]


def test_format_factory_reasoning_tags():
    strict = make_format_reward(think="reasoning")
    assert strict.__name__ == "format_reasoning_strict"
    assert BUILTIN_REWARDS["format_reasoning_strict"].__name__ == "format_reasoning_strict"
    good = "<reasoning>\nr\n</reasoning>\n<answer>\n1\n</answer>"
    assert strict(["q"], [good, "<think>\nr\n</think>\n<answer>\n1\n</answer>"]) == [1.0, 0.0]
    assert make_format_reward(answer="final", strict=False).__name__ == "format_final_lenient"
    with pytest.raises(ValueError, match="tag name"):
        make_format_reward(think="<think>")


# ---------------------------------------------------------------------------------------- length


def test_length_reward_shape():
    fn = make_length_reward(100, min_tokens=10, max_tokens=200)
    ids = [[0] * n for n in (0, 5, 10, 100, 150, 200, 500)]
    assert fn(["q"] * 7, ["c"] * 7, completion_ids=ids) == [0.0, 0.5, 1.0, 1.0, 0.5, 0.0, 0.0]
    default = BUILTIN_REWARDS["length"]
    assert default(["q"] * 2, ["c"] * 2, completion_ids=[[0] * 512, [0] * 768]) == [1.0, 0.5]
    with pytest.raises(ValueError, match="completion_ids"):
        default(["q"], ["c"])
    with pytest.raises(ValueError, match="min_tokens <= target_tokens"):
        make_length_reward(10, max_tokens=5)


# ------------------------------------------------------------------------------ code execution


def test_extract_code_block():
    text = "Here:\n```python\nx = 1\n```\nbetter:\n```py\ndef f():\n    return 2\n```\n"
    assert extract_code_block(text) == "def f():\n    return 2\n"
    assert extract_code_block("```\nplain\n```") == "plain\n"
    assert extract_code_block("```python\nunterminated") is None


def test_code_execution_reward():
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    wrong = "```python\ndef add(a, b):\n    return a - b\n```"
    completions = [good, wrong, "no code at all", good]
    tests = ["assert add(2, 3) == 5", ["assert add(1, 1) == 2", "assert add(0, 5) == 5"], "assert True", None]
    assert code_execution_reward(["q"] * 4, completions, tests=tests) == [1.0, 0.0, 0.0, None]
    assert code_execution_reward(["q"], [good], test_code=["assert add(1, 2) == 3"]) == [1.0]
    with pytest.raises(ValueError, match="tests"):
        code_execution_reward(["q"], [good])


def test_registry_names():
    for name in ("gsm8k_accuracy", "boxed_accuracy", "format_strict", "format_lenient", "length", "code_execution"):
        assert callable(BUILTIN_REWARDS[name])


# --------------------------------------------------------------------------------------- loading


def test_load_builtin_and_errors():
    assert load_reward_function("gsm8k_accuracy") == ("gsm8k_accuracy", gsm8k_accuracy)
    name, fn = load_reward_function("length")
    assert name == "length" and fn is BUILTIN_REWARDS["length"]
    with pytest.raises(RewardSpecError, match="Did you mean 'gsm8k_accuracy'"):
        load_reward_function("gsm8k_acuracy")
    with pytest.raises(ValueError, match="module:function"):
        load_reward_function("mypkg.rewards.correct")


def test_load_module_path():
    name, fn = load_reward_function("slimgrpo.rewards.builtin:boxed_accuracy")
    assert (name, fn) == ("boxed_accuracy", boxed_accuracy)
    with pytest.raises(RewardSpecError, match="no module named 'no_such_pkg_xyz'"):
        load_reward_function("no_such_pkg_xyz.sub:fn")
    with pytest.raises(RewardSpecError, match="Did you mean 'boxed_accuracy'"):
        load_reward_function("slimgrpo.rewards.builtin:boxed_acuracy")
    with pytest.raises(RewardSpecError, match="not a function"):
        load_reward_function("slimgrpo.rewards.builtin:BUILTIN_REWARDS")


def test_load_file_path(tmp_path):
    (tmp_path / "helpers.py").write_text("BONUS = 0.5\n")
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            from helpers import BONUS
            THRESHOLD = 3

            def correctness(prompts, completions, answer, **kwargs):
                return [1.0 + BONUS if c == a else 0.0 for c, a in zip(completions, answer)]

            class Scorer:
                @staticmethod
                def score(prompts, completions, **kwargs):
                    return [0.0] * len(completions)
            """
        )
    )
    name, fn = load_reward_function("my_rewards.py:correctness", base_dir=tmp_path)
    assert name == "correctness"
    assert fn(["q"], ["x"], answer=["x"]) == [1.5]
    name, fn = load_reward_function(f"{tmp_path}/my_rewards.py:Scorer.score")
    assert name == "score" and fn(["q"], ["x"]) == [0.0]
    loaded = load_reward_functions(["my_rewards.py:correctness", "my_rewards.py:correctness"], base_dir=tmp_path)
    assert [n for n, _ in loaded] == ["correctness", "correctness_2"]
    with pytest.raises(RewardFileNotFoundError, match="missing.py"):
        load_reward_function("missing.py:fn", base_dir=tmp_path)
    with pytest.raises(FileNotFoundError):
        load_reward_function("missing.py:fn", base_dir=tmp_path)
    with pytest.raises(RewardSpecError, match="Callables there: Scorer, correctness"):
        load_reward_function("my_rewards.py:nope", base_dir=tmp_path)
    with pytest.raises(RewardSpecError, match="not a function"):
        load_reward_function("my_rewards.py:THRESHOLD", base_dir=tmp_path)
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(RewardSpecError, match="SyntaxError"):
        load_reward_function("broken.py:f", base_dir=tmp_path)


# ---------------------------------------------------------------------------------------- runner


def const(value):
    def fn(prompts, completions, **kwargs):
        return [value] * len(completions)

    return fn


def uses_answer(prompts, completions, completion_ids=None, answer=None, **kwargs):
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]


def test_runner_weights_none_and_columns():
    def half_none(prompts, completions, **kwargs):
        return [None if i % 2 else 2.0 for i in range(len(completions))]

    runner = RewardRunner([("acc", uses_answer), ("half", half_none)], weights=[1.0, 0.5])
    # 2 prompts x 2 generations: prompts and the answer column given per prompt, expanded per row.
    out = runner.score(["p0", "p1"], ["a", "x", "c", "b"], [[1], [1, 2], [], [3]], {"answer": ["a", "b"]})
    assert isinstance(out, RewardOutput) and out.names == ["acc", "half"]
    assert out.per_function.dtype == torch.float32 and out.per_function.shape == (4, 2)
    assert out.per_function[:, 0].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert math.isnan(out.per_function[1, 1]) and math.isnan(out.per_function[3, 1])
    assert out.total.tolist() == [2.0, 0.0, 1.0, 1.0]
    assert out.fault_counts == {}


def test_runner_all_nan_row_counts_and_its_total_stays_nan():
    runner = RewardRunner([("none", const(None))])
    out = runner.score(["p"], ["c", "d"], None, {})
    assert torch.isnan(out.total).all() and out.total.dtype == torch.float32  # unscorable: no reward, not 0
    assert out.fault_counts == {"total/all_nan": 2}


def test_runner_only_rows_with_no_value_at_all_are_nan():
    def first_only(prompts, completions, **kwargs):
        return [1.5] + [None] * (len(completions) - 1)

    out = RewardRunner([("first", first_only), ("none", const(None))], weights=[2.0, 1.0]).score(
        ["p"], ["a", "b", "c"], None, {})
    assert out.total[0].item() == 3.0 and torch.isnan(out.total[1:]).all()
    assert out.fault_counts == {"total/all_nan": 2}


def test_runner_validation():
    with pytest.raises(ValueError, match="2 reward_weights for 1 reward functions"):
        RewardRunner([("a", const(1.0))], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="on_error"):
        RewardRunner([("a", const(1.0))], on_error="ignore")
    with pytest.raises(ValueError, match="distinct"):
        RewardRunner([("a", const(1.0)), ("a", const(2.0))])
    with pytest.raises(ValueError, match="isolation"):
        RewardRunner([("a", const(1.0))], isolation="vm")
    runner = RewardRunner([("a", const(1.0))])
    with pytest.raises(ValueError, match="column 'answer' has 2 values for 3"):
        runner.score(["p"], ["a", "b", "c"], None, {"answer": [1, 2]})
    with pytest.raises(ValueError, match="clash"):
        runner.score(["p"], ["a"], None, {"prompts": ["x"]})


def _raises(prompts, completions, **kwargs):
    raise KeyError("missing_column")


def _wrong_length(prompts, completions, **kwargs):
    return [1.0]


def _scalar(prompts, completions, **kwargs):
    return 1.0


def _text_value(prompts, completions, **kwargs):
    return [1.0, "yes", 1.0]


def _nan_value(prompts, completions, **kwargs):
    return [1.0, 1.0, float("inf")]


# (function, fault, rows affected, first offending index)
FAULTS = [
    (_raises, "exception", 3, 0),
    (_wrong_length, "wrong_length", 3, 0),
    (_scalar, "wrong_length", 3, 0),
    (_text_value, "not_a_number", 1, 1),
    (_nan_value, "non_finite", 1, 2),
]


@pytest.mark.parametrize("fn, fault, affected, index", FAULTS)
@pytest.mark.parametrize("on_error", ["raise", "zero", "skip"])
def test_runner_faults(fn, fault, affected, index, on_error):
    runner = RewardRunner([("good", const(1.0)), ("bad", fn)], on_error=on_error)
    prompts, completions = ["prompt A", "prompt B", "prompt C"], ["compl A", "compl B", "compl C"]
    if on_error == "raise":
        with pytest.raises(RewardFunctionError) as info:
            runner.score(prompts, completions, None, {})
        message = str(info.value)
        assert "'bad'" in message and fault in message
        assert prompts[index] in message and completions[index] in message
        assert (info.value.function, info.value.fault, info.value.index) == ("bad", fault, index)
        return
    out = runner.score(prompts, completions, None, {})
    assert out.fault_counts == {f"bad/{fault}": affected}
    bad = out.per_function[:, 1]
    offending = list(range(3)) if affected == 3 else [index]
    for row in range(3):
        if row in offending:
            assert (bad[row] == 0.0) if on_error == "zero" else math.isnan(bad[row])
            assert out.total[row] == 1.0
        else:
            assert bad[row] == 1.0 and out.total[row] == 2.0


def test_runner_error_message_truncates_long_text():
    runner = RewardRunner([("bad", _raises)])
    with pytest.raises(RewardFunctionError) as info:
        runner.score([[{"role": "user", "content": "q" * 1000}]], ["c" * 1000], None, {})
    message = str(info.value)
    assert "KeyError" in message and "missing_column" in message
    assert "user: qqq" in message and len(message) < 2000


def test_runner_accepts_tensors_numpy_and_async():
    import numpy as np

    async def async_fn(prompts, completions, **kwargs):
        return [0.5] * len(completions)

    runner = RewardRunner(
        [("t", lambda prompts, completions, **kw: torch.ones(2)), ("n", lambda **kw: np.array([1, 2])),
         ("a", async_fn), ("b", lambda **kw: [True, False])]
    )
    out = runner.score(["p"], ["x", "y"], None, {})
    assert out.per_function.tolist() == [[1.0, 1.0, 0.5, 1.0], [1.0, 2.0, 0.5, 0.0]]


_release = threading.Event()


def _hangs(prompts, completions, **kwargs):
    _release.wait(10)  # a stuck function; released at the end of the test so the thread ends
    return [1.0] * len(completions)


@pytest.mark.parametrize("on_error", ["raise", "zero", "skip"])
def test_runner_timeout_from_non_main_thread(on_error):
    runner = RewardRunner([("ok", const(1.0)), ("slow", _hangs)], on_error=on_error, timeout_s=0.2)
    result: dict = {}

    def work():
        try:
            result["out"] = runner.score(["p"], ["a", "b"], None, {})
        except Exception as exc:  # checked below
            result["error"] = exc

    start = time.monotonic()
    caller = threading.Thread(target=work)
    caller.start()
    caller.join(5)
    elapsed = time.monotonic() - start
    _release.set()
    _release.clear()
    assert elapsed < 2.0
    if on_error == "raise":
        assert isinstance(result["error"], RewardFunctionError) and result["error"].fault == "timeout"
        return
    out = result["out"]
    assert out.fault_counts == {"slow/timeout": 2}
    assert out.total.tolist() == [1.0, 1.0]


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
def test_runner_process_isolation_kills_on_timeout_and_reports_errors():
    def spin(prompts, completions, **kwargs):
        while True:
            pass

    runner = RewardRunner(
        [("spin", spin), ("bad", _raises), ("ok", const(1.0))], on_error="skip", timeout_s=0.5, isolation="process"
    )
    start = time.monotonic()
    out = runner.score(["p"], ["a"], None, {})
    assert time.monotonic() - start < 5.0
    assert out.fault_counts == {"spin/timeout": 1, "bad/exception": 1}
    assert out.total.tolist() == [1.0]
    strict = RewardRunner([("bad", _raises)], isolation="process")
    with pytest.raises(RewardFunctionError, match="missing_column"):
        strict.score(["p"], ["a"], None, {})
