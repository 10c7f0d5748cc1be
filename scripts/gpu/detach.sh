#!/usr/bin/env bash
# Run `make bench-gpu` (or DETACH_TARGET=bench-offline, soak-gpu) detached, for
# hosts whose remote commands have a time limit shorter than the benchmark (the
# whole set takes 30+ minutes).
#
#   bash scripts/gpu/detach.sh start [BENCH_GPU_ARGS...]   # returns at once
#   bash scripts/gpu/detach.sh poll SECONDS TARBALL         # wait, then pack
#
# start: the harness runs in a session of its own (setsid), so it outlives
# the command that started it; results and its log go to $DETACH_DIR
# (default /tmp/tagma-bench-run). poll: waits up to SECONDS for the run to
# finish, prints the log's tail, and packs the results (traces left out) into
# TARBALL (tar.xz), so one file carries them back; past $DETACH_PART_BYTES
# (default 15 MiB, under the device tool's 16 MiB a file) it is split into
# TARBALL.part00, .part01, ...: `cat TARBALL.part* | tar -xJf -`. Exit code 0
# once the run is done (make's own code is printed), 3 while it still runs
# (also when it ends during packing: that pack may lack its last results).
#
# Several targets run one after the other in one detached run (a failing
# one does not stop the next), each with its own arguments, e.g. the offline
# set, then a suite, then the soak:
#   DETACH_TARGET="bench-offline bench-gpu soak-gpu" SOAK_ARGS="" \
#     OFFLINE_ARGS="--variants paged-stock,tagma --resident --warmup" \
#     bash scripts/gpu/detach.sh start --suites 8b-128k-poisson --resident
# The arguments after `start` go to bench-gpu, and to soak-gpu and
# bench-offline unless SOAK_ARGS / OFFLINE_ARGS is set. bench-gpu's results
# go to results/, the soak's to results/soak/, bench-offline's to
# results/offline/ beside other targets (results/ when it runs alone).
# The device host is given back after a short idle time, and a detached run
# dies with it: poll again at once.
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=${DETACH_DIR:-/tmp/tagma-bench-run}
target=${DETACH_TARGET:-bench-gpu}

case ${1:-} in
  start)
    shift
    rm -rf "$dir" && mkdir -p "$dir/results"
    offline_out="$dir/results"
    [ "$target" = bench-offline ] || offline_out="$dir/results/offline"
    # One make per target, so each gets its own arguments. The exit code
    # (the last failing target's, else 0) lands in $dir/rc when the chain
    # ends (a pid alone cannot tell a finished run from a zombie nobody
    # reaps).
    PYTHONUNBUFFERED=1 OUT_DIR="$dir/results" OFFLINE_OUT="$offline_out" \
      GPU_ARGS="$*" SOAK_ARGS="${SOAK_ARGS-$*}" OFFLINE_ARGS="${OFFLINE_ARGS-$*}" \
      DIR="$dir" TARGET="$target" setsid nohup bash -c '
        rc=0
        for t in $TARGET; do
          case $t in
            bench-offline) args=$OFFLINE_ARGS ;;
            soak-gpu) args=$SOAK_ARGS ;;
            *) args=$GPU_ARGS ;;
          esac
          make "$t" BENCH_GPU_OUT="$OUT_DIR" BENCH_OFFLINE_OUT="$OFFLINE_OUT" \
            SOAK_OUT="$OUT_DIR/soak" BENCH_GPU_ARGS="$args" SOAK_ARGS="$args" || rc=$?
        done
        echo $rc >"$DIR/rc"' \
      >"$dir/bench.log" 2>&1 </dev/null &
    echo "started, log $dir/bench.log"
    ;;
  poll)
    secs=${2:?seconds}
    tarball=${3:?tarball}
    [ -f "$dir/bench.log" ] || { echo "no detached run in $dir"; exit 2; }
    for _ in $(seq "$secs"); do
      [ -f "$dir/rc" ] && break
      sleep 1
    done
    # Decide before packing: a run that ends while tar runs would otherwise
    # be reported finished with its last results missing from the pack.
    finished=0
    [ -f "$dir/rc" ] && finished=1
    tail -n 40 "$dir/bench.log"
    rm -f "$tarball" "$tarball".part*
    XZ_OPT=${XZ_OPT:--T0} tar -cJf "$tarball" --exclude=trace -C "$dir" results bench.log
    part=${DETACH_PART_BYTES:-15728640}
    if [ "$(stat -c %s "$tarball")" -gt "$part" ]; then
      split -b "$part" -d "$tarball" "$tarball.part" && rm "$tarball"
      echo "packed in $(ls "$tarball".part* | wc -l) parts: cat $tarball.part* | tar -xJf -"
    fi
    if [ "$finished" = 0 ]; then echo "still running"; exit 3; fi
    echo "finished (make exit code $(cat "$dir/rc"))"
    ;;
  *)
    echo "usage: $0 start [ARGS...] | poll SECONDS TARBALL" >&2
    exit 2
    ;;
esac
