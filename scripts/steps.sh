# Sourced by the GPU scripts (gpu_check.sh, gpu_copy_engines.sh, rocm_check.sh): their steps.
# Needs LOG (the log directory) and STEPS (the steps to run); sets rc=1 when a step fails.
# STEP_TAIL: lines of each step's log echoed into LOG/summary.txt (default 4).
rc=0
has() { [[ " $STEPS " == *" $1 "* ]]; }
step() { # step NAME SECONDS CMD...: runs CMD with a time limit, logs to NAME.txt
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*" | tee -a "$LOG/summary.txt"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$LOG/$name.txt" 2>&1
  local r=$?
  echo "   rc=$r in $((SECONDS - t0)) s" | tee -a "$LOG/summary.txt"
  tail -"${STEP_TAIL:-4}" "$LOG/$name.txt" | sed 's/^/   | /' | tee -a "$LOG/summary.txt"
  [ $r -eq 0 ] || rc=1
}
# The path of XLA's CUDA PJRT plugin in the installed jax-cuda wheel (empty if none): what
# `peerless bench/run --backend xla` load.
xla_cuda_plugin() {
  python3 -c 'import importlib.util as u, os
for m in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
    s = u.find_spec(m)
    for d in (s.submodule_search_locations if s else []):
        p = os.path.join(d, "xla_cuda_plugin.so")
        if os.path.exists(p): print(p); raise SystemExit' 2>/dev/null
}
