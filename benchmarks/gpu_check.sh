#!/usr/bin/env bash
# The GPU checks in one go, for a machine that has a CUDA PyTorch but not this project's
# environment (a lent GPU machine gets the repository alone, without network or ../shared):
#   1. the CUDA-marked tests (tests/test_devices.py: CUDA against the CPU),
#   2. benchmarks/gpu_rounds.py (seconds per OvA-LP / LoRA / full fine-tuning round),
#   3. the unit tests of the training paths with device "auto", i.e. on CUDA.
# Packages the machine lacks travel as wheels in .whl/ (README, "Fine-tuning the encoder"),
# installed with --no-deps into /tmp/site. Logs and results go to $OUT (default /tmp/gpu-check).
#
#     OUT=/tmp/gpu-check bash benchmarks/gpu_check.sh
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch, timm, peft, transformers, flwr, dp_accounting, server_app
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'timm', timm.__version__, 'peft', peft.__version__, 'transformers',
      transformers.__version__, 'flwr', flwr.__version__)"; } 2>&1 | tee "$OUT/env.txt"

timeout 150 python3 -m pytest -v -p no:cacheprovider -m cuda tests/test_devices.py 2>&1 \
  | tee "$OUT/cuda-tests.log"
timeout 150 python3 benchmarks/gpu_rounds.py 2>&1 | tee "$OUT/gpu-rounds.log"
cp benchmarks/results/gpu_rounds_cuda.* "$OUT/" 2>/dev/null
SUITE_SECONDS=${SUITE_SECONDS:-150}  # 0: skip step 3
if [ "$SUITE_SECONDS" -gt 0 ]; then
  timeout "$SUITE_SECONDS" python3 -m pytest -v -p no:cacheprovider -m "not e2e and not cuda" \
    tests/test_training.py tests/test_heads.py tests/test_head_init.py tests/test_model.py \
    tests/test_finetune.py tests/test_personalize.py tests/test_server.py \
    tests/test_server_lbfgs.py tests/test_leave_out.py tests/test_holdout.py 2>&1 \
    | tee "$OUT/suite-on-cuda.log"
fi
