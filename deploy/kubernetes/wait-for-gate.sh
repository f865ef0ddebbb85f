#!/usr/bin/env bash
# Wait for the master Job of a headless run to end, pass or fail, and exit with vllm-load's own exit code (0 the
# SLOs passed, 3 one missed, 4 invalid, 5 untrustworthy: docs/gates.md "Exit codes"). `kubectl wait
# --for=condition=complete` alone waits its whole timeout when the gate fails: a failed Job never completes.
#   bash deploy/kubernetes/wait-for-gate.sh [JOB (vllm-load-master)] [TIMEOUT (2h)]
set -uo pipefail
JOB=${1:-vllm-load-master}
TIMEOUT=${2:-2h}
kubectl wait --for=condition=complete "job/$JOB" --timeout="$TIMEOUT" >/dev/null 2>&1 &
done_ok=$!
kubectl wait --for=condition=failed "job/$JOB" --timeout="$TIMEOUT" >/dev/null 2>&1 &
done_failed=$!
wait -n "$done_ok" "$done_failed"
kill "$done_ok" "$done_failed" 2>/dev/null
code=$(kubectl get pod -l "job-name=$JOB" \
  -o jsonpath='{.items[-1:].status.containerStatuses[0].state.terminated.exitCode}' 2>/dev/null)
if [ -z "$code" ]; then
  echo "vllm-load: job/$JOB did not finish within $TIMEOUT (or its pod is gone): exit 1" >&2
  exit 1
fi
echo "vllm-load: job/$JOB finished with exit code $code"
exit "$code"
