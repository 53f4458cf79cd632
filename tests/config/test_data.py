import csv
import json

import pytest

from slimgrpo.config import DataConfig
from slimgrpo.data import DataError, PromptSampler, build_dataset, load_prompt_dataset, read_rows
from slimgrpo.modeling import load_tokenizer

from conftest import GSM8K_TEST, needs_gsm8k, write_jsonl


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def chat_tok(tiny_chat_model_dir):
    return load_tokenizer(str(tiny_chat_model_dir))


ROWS = [{"prompt": "What is 1 plus 2?", "answer": "3"}, {"prompt": "What is 2 plus 2?", "answer": "4"}]


def test_jsonl_csv_parquet_and_datasets_folder_agree(tmp_path, tok):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(tmp_path / "p.jsonl", ROWS)
    with (tmp_path / "p.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["prompt", "answer"])
        w.writeheader()
        w.writerows(ROWS)
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "p.parquet")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    (tmp_path / "p.json").write_text(json.dumps(ROWS))
    cfg = DataConfig()
    results = [load_prompt_dataset(str(tmp_path / n), tok, cfg) for n in ("p.jsonl", "p.csv", "p.parquet", "ds", "p.json")]
    for ds in results:
        assert ds.prompts == [r["prompt"] for r in ROWS]
        assert ds.columns["answer"] == ["3", "4"]
        assert ds.prompt_ids == results[0].prompt_ids


def test_bad_jsonl_row_named_with_line(tmp_path, tok):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "ok"}\n{"prompt": oops}\n')
    with pytest.raises(DataError, match=r"bad.jsonl: line 2 is not valid JSON"):
        load_prompt_dataset(str(p), tok, DataConfig())
    assert p.read_text().startswith('{"prompt": "ok"}')  # the user's data is untouched


def test_files_saved_with_a_byte_order_mark(tmp_path, tok):
    """Windows editors and Excel write UTF-8 with a BOM: JSONL, JSON and CSV read as without it."""
    bom = "\ufeff"
    (tmp_path / "p.jsonl").write_text(bom + "".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    (tmp_path / "p.json").write_text(bom + json.dumps(ROWS), encoding="utf-8")
    (tmp_path / "p.csv").write_text(bom + "prompt,answer\n" + "".join(f"{r['prompt']},{r['answer']}\n" for r in ROWS),
                                    encoding="utf-8")
    for name in ("p.jsonl", "p.json", "p.csv"):
        ds = load_prompt_dataset(str(tmp_path / name), tok, DataConfig())
        assert ds.prompts == [r["prompt"] for r in ROWS], name
        assert ds.columns["answer"] == ["3", "4"], name


def test_missing_file_and_unsupported_type(tmp_path, tok):
    with pytest.raises(DataError, match="does not exist"):
        read_rows(str(tmp_path / "nope.jsonl"))
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DataError, match="unsupported file type"):
        read_rows(str(tmp_path / "x.txt"))


def test_missing_prompt_column_suggests_one(tmp_path, tok):
    write_jsonl(tmp_path / "q.jsonl", [{"question": "2+2?", "answer": "4"}])
    with pytest.raises(DataError, match=r"row 1: no column 'prompt'.*data.prompt_column=question"):
        load_prompt_dataset(str(tmp_path / "q.jsonl"), tok, DataConfig())


def test_empty_dataset(tmp_path, tok):
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DataError, match="empty"):
        load_prompt_dataset(str(tmp_path / "e.jsonl"), tok, DataConfig())


@needs_gsm8k
def test_gsm8k_with_prompt_template(tok):
    cfg = DataConfig(prompt_template="Question: {question}\nAnswer:", max_samples=5)
    ds = load_prompt_dataset(str(GSM8K_TEST), tok, cfg)
    assert len(ds) == 5 and ds.prompts[0].startswith("Question: Janet")
    assert ds.columns["answer"][0].endswith("#### 18")
    assert "question" in ds.columns  # every column reaches the reward functions


def test_overflow_truncate_skip_error(tmp_path, tok):
    rows = [{"prompt": "short"}, {"prompt": "a much longer prompt " * 20}]
    write_jsonl(tmp_path / "o.jsonl", rows)
    ds = load_prompt_dataset(str(tmp_path / "o.jsonl"), tok, DataConfig(max_prompt_length=8))
    assert ds.num_truncated == 1 and max(map(len, ds.prompt_ids)) == 8
    ds = load_prompt_dataset(str(tmp_path / "o.jsonl"), tok, DataConfig(max_prompt_length=8, prompt_overflow="skip"))
    assert len(ds) == 1 and ds.num_skipped == 1
    with pytest.raises(DataError, match="row 2: prompt has"):
        load_prompt_dataset(str(tmp_path / "o.jsonl"), tok, DataConfig(max_prompt_length=8, prompt_overflow="error"))


def test_conversational_prompts_use_chat_template(tmp_path, chat_tok):
    rows = [{"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"}]
    write_jsonl(tmp_path / "c.jsonl", rows)
    ds = load_prompt_dataset(str(tmp_path / "c.jsonl"), chat_tok, DataConfig(system_prompt="Be brief."))
    text = chat_tok.decode(ds.prompt_ids[0])
    assert text.startswith("<system>Be brief.") and text.endswith("<assistant>")
    assert ds.prompts[0] == rows[0]["prompt"]  # rewards see the conversation as the dataset holds it


def test_conversation_without_template_errors(tmp_path, tok):
    write_jsonl(tmp_path / "c.jsonl", [{"prompt": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DataError, match="no chat template"):
        load_prompt_dataset(str(tmp_path / "c.jsonl"), tok, DataConfig(use_chat_template="always"))


def test_bad_prompt_type(tmp_path, tok):
    write_jsonl(tmp_path / "b.jsonl", [{"prompt": 3}])
    with pytest.raises(DataError, match="row 1: column 'prompt' must hold text"):
        load_prompt_dataset(str(tmp_path / "b.jsonl"), tok, DataConfig())


def test_sampler_is_seeded_and_resumable():
    a = PromptSampler(size=7, prompts_per_step=3, seed=1)
    seq = [a.next_global_batch() for _ in range(5)]
    assert all(len(b) == 3 for b in seq)
    first_epoch = sum(seq, [])[:7]
    assert sorted(first_epoch) == list(range(7))  # every prompt once per epoch
    b = PromptSampler(size=7, prompts_per_step=3, seed=1)
    for _ in range(2):
        b.next_global_batch()
    c = PromptSampler(size=7, prompts_per_step=3, seed=1)
    c.load_state_dict(b.state_dict())
    assert [c.next_global_batch() for _ in range(3)] == seq[2:]
    with pytest.raises(DataError, match="dataset of 7 prompts"):
        PromptSampler(size=8, prompts_per_step=3, seed=1).load_state_dict(b.state_dict())


def test_build_dataset_keeps_row_numbers(tok):
    ds = build_dataset([{"prompt": "a"}, {"prompt": "b"}], tok, DataConfig(), source="mem")
    assert ds.batch([1]).indices == [1]
