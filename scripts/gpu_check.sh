#!/usr/bin/env bash
# The GPU check: one script, offline, under 8 minutes on one H100 or H200.
#
#   scripts/gpu_check.sh                 # on a machine with a CUDA GPU
#   scripts/gpu_check.sh --cpu-dry-run   # the same steps shrunk to tiny shapes, on the CPU:
#                                        # proves the plumbing, measures nothing
#
# Steps, each under its own timeout and all within one budget. A failed step stops nothing
# else, except that nothing runs after a failed env and the run's checks need its training:
#   env          Python, torch, its CUDA build and the device. `lm` is imported from this
#                tree (PYTHONPATH); only if that fails is anything installed: offline from the
#                wheels in $GPU_CHECK_WHEELS (default .whl/) when there are any, else with
#                `pip install -e .`, which needs a package registry. The installed torch is
#                used as it is.
#   tests        tests/test_cuda.py: fused against explicit attention with padding, bf16
#                autocast, KV cache, torch.compile, training, evaluation memory, matmul peak.
#   bench        scripts/bench.py at GPT-2 small's shape (12/12/768, context 1024, vocabulary
#                50304), 32 sequences a step, bf16, eager and compiled: tokens/s and MFU
#                against the datasheet peak of a GPU it knows by name.
#   gpt2-data    a corpus generated here (seeded pseudo-words; big enough for a 50304-token BPE
#                and a validation split of about 450 windows of 1024 tokens).
#   gpt2-train   configs/gpt2-124m.yaml with its own model, vocabulary, batch, accumulation,
#                dtype and compile settings on that corpus: 4 steps, its first evaluation and
#                checkpoint at step 3. The evaluation uses the config's default evaluation
#                batch over all ~450 validation windows, so a default that grows with
#                train.batch_size (512) shows here: all ~450 windows in one batch would need
#                over 200 GB for the logits, their fp32 copy and its log-softmax.
#   gpt2-check   the run's metrics hold a validation loss at step 3 and its checkpoint is whole.
#   gpt2-eval    `lm eval` on that run (the default evaluation batch), 4 batches.
#   gpt2-sample  `lm sample` from that run's checkpoint.
#   kernels      scripts/attention_kernels.py: document masks and ALiBi, SDPA with a mask tensor
#                against FlexAttention, forward and backward.
#   decode       scripts/bench.py --decode --compile: greedy decoding tokens/s, KV cache
#                (eager and its one-token step compiled) and recomputing.
#
# Results go to $OUT (default: a new temporary folder): gpu_check.log (every step's output),
# summary.txt, bench.json, decode.json and the GPT-2 run's config, metrics and eval.json; the
# summary is printed last. Exit status 0 when every step passed. Nothing is downloaded: the
# data is generated here and the Hugging Face libraries are switched offline.
#
# Environment: PYTHON (the interpreter; default the first of .venv/bin/python, python3 that
# imports torch, preferring one that sees a GPU), OUT, GPU_CHECK_WHEELS, GPU_CHECK_BUDGET_S
# (all steps together; default 470, or 240 for the dry run), GPU_CHECK_CPU_DRY_RUN=1 (same as
# --cpu-dry-run), GPU_CHECK_KEEP=1 (keep the scratch folder with the run and its checkpoints).

set -uo pipefail

DRY_RUN=${GPU_CHECK_CPU_DRY_RUN:-0}
for arg in "$@"; do
    case $arg in
        --cpu-dry-run) DRY_RUN=1 ;;
        -h | --help)
            sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "gpu_check.sh: unknown argument '$arg' (see --help)" >&2
            exit 2
            ;;
    esac
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-$(mktemp -d -t gpu_check_out.XXXXXX)}
mkdir -p "$OUT"
WORK=$(mktemp -d -t gpu_check_work.XXXXXX)
if [ "${GPU_CHECK_KEEP:-0}" = 1 ]; then
    echo "gpu_check: scratch folder kept: $WORK"
else
    trap 'rm -rf "$WORK"' EXIT
fi
LOG=$OUT/gpu_check.log
: >"$LOG"

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
export LM_CACHE=$WORK/lm-cache
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}

if [ "$DRY_RUN" = 1 ]; then
    BUDGET_S=${GPU_CHECK_BUDGET_S:-240}
    DEVICE=cpu
else
    BUDGET_S=${GPU_CHECK_BUDGET_S:-470}
    DEVICE=cuda
fi
DEADLINE=$((SECONDS + BUDGET_S))

log() { echo "$*" | tee -a "$LOG"; }

# --- the interpreter --------------------------------------------------------------------------
has_torch() { "$1" -c "import torch" >/dev/null 2>&1; }
sees_gpu() { "$1" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" >/dev/null 2>&1; }
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    candidates=()
    for c in "$ROOT/.venv/bin/python" python3 python; do
        command -v "$c" >/dev/null 2>&1 && has_torch "$c" && candidates+=("$c")
    done
    if [ "$DRY_RUN" != 1 ]; then
        for c in "${candidates[@]}"; do
            if sees_gpu "$c"; then PY=$c && break; fi
        done
    fi
    if [ -z "$PY" ] && [ "${#candidates[@]}" -gt 0 ]; then PY=${candidates[0]}; fi
fi
if [ -z "$PY" ]; then
    log "gpu_check: no Python with torch found (set PYTHON=/path/to/python)"
    exit 1
fi

# --- steps ------------------------------------------------------------------------------------
NAMES=()
RESULTS=()
TIMES=()
STOP= # once set, the reason every later step is skipped

# run_step NAME LIMIT_S COMMAND...: runs COMMAND under min(LIMIT_S, the time left), its output
# to the terminal and the log; records PASS, FAIL (status) or TIMEOUT.
run_step() {
    local name=$1 limit=$2 left rc start result arg shown=()
    shift 2
    if [ -n "$STOP" ]; then
        skip_step "$name" "$STOP"
        return
    fi
    left=$((DEADLINE - SECONDS))
    if [ "$left" -lt "$limit" ]; then limit=$left; fi
    if [ "$limit" -lt 5 ]; then
        skip_step "$name" "no time left of ${BUDGET_S} s"
        return
    fi
    NAMES+=("$name")
    log ""
    for arg in "$@"; do # inline Python shows as a placeholder, not dozens of lines
        if [[ $arg == *$'\n'* ]]; then shown+=("<inline python>"); else shown+=("$arg"); fi
    done
    log "== $name (at most ${limit} s): ${shown[*]}"
    start=$SECONDS
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    case $rc in
        0) result=PASS ;;
        124 | 137) result="TIMEOUT after ${limit} s" ;;
        *) result="FAIL (exit $rc)" ;;
    esac
    RESULTS+=("$result")
    TIMES+=($((SECONDS - start)))
    log "== $name: $result in $((SECONDS - start)) s"
}

passed() { # passed NAME: did step NAME pass?
    local i
    for i in "${!NAMES[@]}"; do
        if [ "${NAMES[$i]}" = "$1" ]; then
            [ "${RESULTS[$i]}" = PASS ]
            return
        fi
    done
    return 1
}

skip_step() { # skip_step NAME REASON
    NAMES+=("$1")
    RESULTS+=("SKIP ($2)")
    TIMES+=(0)
    log "== $1: skipped ($2)"
}

# env: import lm from this tree; install only if that fails.
IMPORTS="import lm.training, lm.cli, datasets, tokenizers, safetensors, yaml, pytest"
if ! "$PY" -c "$IMPORTS" >>"$LOG" 2>&1; then
    WHEELS=${GPU_CHECK_WHEELS:-$ROOT/.whl}
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        log "gpu_check: $PY cannot import the project's packages; installing the wheels in $WHEELS"
        timeout 300 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target "$WORK/site" "$WHEELS"/*.whl 2>&1 | tee -a "$LOG"
        export PYTHONPATH=$PYTHONPATH:$WORK/site
    else
        log "gpu_check: $PY cannot import the project's packages; pip install -e '.[dev]'"
        timeout 300 "$PY" -m pip install -q --retries 1 --timeout 15 -e ".[dev]" 2>&1 | tee -a "$LOG"
    fi
fi

ENV_PY=$(cat <<'EOF'
import platform, sys, torch
print(f"python {platform.python_version()} at {sys.executable}")
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, GPU seen: {torch.cuda.is_available()}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, {p.total_memory / 2**30:.1f} GiB, compute capability {p.major}.{p.minor}, {p.multi_processor_count} SMs")
import lm.training, lm.cli, datasets, tokenizers, pytest
print(f"lm from {lm.__file__}; datasets {datasets.__version__}, tokenizers {tokenizers.__version__}")
if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    sys.exit("no CUDA device visible to torch: nothing below can run on a GPU")
EOF
)
run_step env 60 "$PY" -c "$ENV_PY" "$DEVICE"
passed env || STOP="the env step failed"
if command -v nvidia-smi >/dev/null 2>&1 && [ "$DRY_RUN" != 1 ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
        2>&1 | tee -a "$LOG"
fi

run_step tests 200 "$PY" -m pytest tests/test_cuda.py -q -rs -p no:cacheprovider

if [ "$DRY_RUN" = 1 ]; then
    BENCH_ARGS=(--device cpu --shapes nanogpt-cpu --dtypes fp32 --steps 2 --warmup 1)
else
    BENCH_ARGS=(--device cuda --shapes gpt2-small --dtypes bf16 --compile --batch 32 --steps 10)
fi
run_step bench 150 "$PY" scripts/bench.py "${BENCH_ARGS[@]}" --out "$OUT/bench.json"

# A corpus no download is needed for: pseudo-words from seeded syllables, Zipf-distributed, in
# JSONL documents. 800k words give a full 50304-token BPE and ~470k validation tokens.
CORPUS_PY=$(cat <<'EOF'
import json, sys
import numpy as np
path, n_words = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
lexicon = sorted({"".join(rng.choice(syllables, size=rng.integers(1, 5))) for _ in range(80_000)})
weights = 1.0 / np.arange(1, len(lexicon) + 1)
words = rng.choice(len(lexicon), size=n_words, p=weights / weights.sum())
with open(path, "w") as f:
    for doc in np.array_split(words, max(1, n_words // 400)):
        sentences = np.array_split(doc, max(1, len(doc) // 12))
        text = ". ".join(" ".join(lexicon[i] for i in s).capitalize() for s in sentences)
        f.write(json.dumps({"text": text + "."}) + "\n")
print(f"{path}: {n_words:,} words from a lexicon of {len(lexicon):,}")
EOF
)
CORPUS=$WORK/corpus.jsonl
RUN=$WORK/gpt2-run
if [ "$DRY_RUN" = 1 ]; then
    N_WORDS=20000
    SHRINK=(model.n_layer=2 model.n_head=2 model.d_model=64 model.context_length=64
        data.vocab_size=512 train.batch_size=64 train.dtype=fp32 train.compile=false)
    EVAL_ARGS=(--max-batches 2)
    NEW_TOKENS=16
    DECODE_TOKENS=8
else
    N_WORDS=800000
    SHRINK=()
    EVAL_ARGS=(--max-batches 4)
    NEW_TOKENS=128
    DECODE_TOKENS=512
fi
run_step gpt2-data 60 "$PY" -c "$CORPUS_PY" "$CORPUS" "$N_WORDS"

# The config's own model, tokenizer size, batch, accumulation, dtype and compile setting; only
# the source, the length of the run and where it evaluates and checkpoints change.
run_step gpt2-train 200 "$PY" -m lm train configs/gpt2-124m.yaml --out "$RUN" --set \
    "data.source=$CORPUS" data.streaming=false data.max_documents=null data.val_fraction=0.5 \
    train.max_steps=4 train.eval_every=3 train.checkpoint_every=3 train.log_every=1 \
    "train.device=$DEVICE" "${SHRINK[@]}"
for f in config.yaml metrics.jsonl; do
    if [ -f "$RUN/$f" ]; then cp "$RUN/$f" "$OUT/gpt2-$f"; fi
done

RUN_CHECK_PY=$(cat <<'EOF'
import json, sys
from pathlib import Path
from lm.runs.checkpoint import complete_checkpoints
run = Path(sys.argv[1])
lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
val = {m["step"]: m["val_loss"] for m in lines if "val_loss" in m}
train = [m for m in lines if "train_loss" in m]
names = [p.name for p in complete_checkpoints(run)]
print(f"val_loss by step: {val}; checkpoints: {names}")
first, last = train[0], train[-1]
print(f"train_loss {first['train_loss']:.3f} -> {last['train_loss']:.3f}")
print(f"last logged step: {last['tokens_per_s']:,.0f} tokens/s")
if 3 not in val or "step_00000003" not in names:
    sys.exit("the run did not reach its first evaluation and checkpoint (step 3)")
EOF
)
if passed gpt2-train; then
    run_step gpt2-check 30 "$PY" -c "$RUN_CHECK_PY" "$RUN"
    run_step gpt2-eval 60 "$PY" -m lm eval "$RUN" --device "$DEVICE" "${EVAL_ARGS[@]}"
    if [ -f "$RUN/eval.json" ]; then cp "$RUN/eval.json" "$OUT/gpt2-eval.json"; fi
    run_step gpt2-sample 60 "$PY" -m lm sample "$RUN" --device "$DEVICE" --prompt "Ba" \
        --max-new-tokens "$NEW_TOKENS"
else
    for name in gpt2-check gpt2-eval gpt2-sample; do skip_step "$name" "gpt2-train failed"; done
fi

KERNEL_ARGS=(--rounds 3)
if [ "$DRY_RUN" = 1 ]; then KERNEL_ARGS=(--rounds 1 --calls 1); fi
run_step kernels 60 "$PY" scripts/attention_kernels.py --device "$DEVICE" "${KERNEL_ARGS[@]}"

run_step decode 90 "$PY" scripts/bench.py --device "$DEVICE" --no-train --decode --compile \
    --decode-tokens "$DECODE_TOKENS" --out "$OUT/decode.json"

# --- summary ----------------------------------------------------------------------------------
FIGURES_PY=$(cat <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])


def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None


for r in (load("bench.json") or {}).get("training", []):
    kind = "compiled" if r["compile"] else "eager"
    mem = f", peak GPU memory {r['peak_gpu_mb'] / 1024:.1f} GiB" if "peak_gpu_mb" in r else ""
    print(
        f"bench {r['shape']} {r['dtype']} {kind}, batch {r['batch']}: "
        f"{r['tokens_per_s']:,} tokens/s, MFU {r['mfu']:.1%} against {r['peak_source']}{mem}"
    )
d = (load("decode.json") or {}).get("decode")
if d:
    print(
        f"decode {d['new_tokens']} tokens (6/6/384): KV cache {d['kv_cache_tokens_per_s']} "
        f"tokens/s, compiled {d.get('kv_cache_compiled_tokens_per_s')} tokens/s, recompute "
        f"{d['recompute_tokens_per_s']} tokens/s"
    )
metrics = out / "gpt2-metrics.jsonl"
if metrics.is_file():
    lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    train = [m for m in lines if "train_loss" in m]
    evals = [m["step"] for m in lines if "val_loss" in m]
    if train:
        print(
            f"gpt2-124m: {len(train)} steps logged, the last at "
            f"{train[-1]['tokens_per_s']:,.0f} tokens/s; evaluations at steps {evals}"
        )
EOF
)
{
    echo ""
    echo "== summary ($( [ "$DRY_RUN" = 1 ] && echo "CPU dry run: plumbing only, no figure means anything" || echo "GPU"), $SECONDS s)"
    for i in "${!NAMES[@]}"; do
        printf '%-12s %-30s %4s s\n' "${NAMES[$i]}" "${RESULTS[$i]}" "${TIMES[$i]}"
    done
    "$PY" -c "$FIGURES_PY" "$OUT" 2>&1
    echo "results in $OUT"
} | tee "$OUT/summary.txt" | tee -a "$LOG"

for result in "${RESULTS[@]}"; do
    [ "$result" = PASS ] || exit 1
done
exit 0
