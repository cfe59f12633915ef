"""lm-evaluation-harness on an export: a local loglikelihood task (YAML over a .jsonl, as the
README shows) scores every example exactly as lm's own model does."""

from __future__ import annotations

import json

import pytest
import torch
from _export_support import untrained_run

from lm.cli import main
from lm.runs.load import load_run

DOCS = [
    {"context": "def f(x):\n    return", "continuation": " x + 1"},
    {"context": "The for statement", "continuation": " iterates"},
    {"context": "Caf\u00e9", "continuation": " na\u00efve"},
    {"context": "{", "continuation": "braces}"},
    {"context": "import os\nimport", "continuation": " sys"},
]

TASK = """\
task: lm_local_loglikelihood
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
  cache_dir: {cache}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{continuation}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def lm_loglikelihood(run, context: str, continuation: str) -> float:
    """log p(continuation | context) under lm's model, token by token."""
    tok = run.tokenizer
    ctx, cont = tok.encode(context), tok.encode(continuation)
    with torch.no_grad():
        logits = run.model(torch.tensor([ctx + cont]))
    logp = torch.log_softmax(logits[0].double(), dim=-1)
    return sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_lm_eval_loglikelihoods_equal_lms(position, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    run_dir = untrained_run(tmp_path, position=position)
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tasks / "local.yaml").write_text(TASK.format(docs=docs, cache=tmp_path / "hf-datasets"))

    model = HFLM(pretrained=str(out), dtype="float32", device="cpu", batch_size=2)
    results = simple_evaluate(
        model=model,
        tasks=["lm_local_loglikelihood"],
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        log_samples=True,
    )
    samples = results["samples"]["lm_local_loglikelihood"]
    assert len(samples) == len(DOCS)
    run = load_run(run_dir)
    for sample in samples:
        doc = sample["doc"]
        (theirs, _greedy) = sample["filtered_resps"][0]
        ours = lm_loglikelihood(run, doc["context"], doc["continuation"])
        assert abs(theirs - ours) < 1e-4, doc
