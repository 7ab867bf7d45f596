#!/bin/bash
# lm-eval 0.4.x (installed separately: pip install "lm-eval[api]") against the tiny server: a multiple-choice
# task through local-completions (logprobs + echo) and a generate_until task with 5 `until` strings (6 with the
# EOS lm-eval adds), --batch_size 4, tokenizer_backend=remote (/tokenizer_info, /tokenize, /detokenize).
# Usage: bench/lmeval/run.sh LM_EVAL_BIN [PORT]   (run from the repository root; the scores mean nothing)
set -u
LM_EVAL=${1:?path to the lm_eval executable}
PORT=${2:-18941}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mktemp -d)
setsid mpirun -n 2 python -m cupyglm.cli.serve --backend numpy --host 127.0.0.1 --port "$PORT" --context 512 \
  --parallel 8 --max-queue 32 > "$OUT/server.log" 2>&1 &
SPID=$!
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break; sleep 1; done
rc=0
for task in tiny_mc tiny_gen; do
  (cd "$HERE" && HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 timeout 300 "$LM_EVAL" --model local-completions \
    --tasks "$task" --include_path "$HERE" --batch_size 4 --output_path "$OUT/results" \
    --model_args "base_url=http://127.0.0.1:$PORT/v1/completions,model=cupyglm-tiny,tokenizer_backend=remote,max_retries=1" \
    > "$OUT/$task.log" 2>&1)
  r=$?; echo "$task rc=$r"; tail -4 "$OUT/$task.log"; [ $r -eq 0 ] || rc=1
done
kill -TERM -- -"$SPID" 2>/dev/null; sleep 3; kill -KILL -- -"$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null
rm -rf "$OUT"
exit $rc
