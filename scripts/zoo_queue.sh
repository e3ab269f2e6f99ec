#!/usr/bin/env bash
# The zoo's training runs still to do (issue 26), in order: each session starts this
# script again (`nohup scripts/zoo_queue.sh &`), and it resumes the first unfinished run
# from its last checkpoint (a run is finished when its folder holds summary.json).
# Run it from a clone of main outside the work tree (git clone . ~/.cache/keras-preact/runner;
# with PYTHON=<work tree>/.venv/bin/python), so that edits in progress never change a queued run.
# Runs go to ~/.cache/keras-preact/runs/<name>, at nice 10 so that tests come first;
# `kill -STOP` / `kill -CONT` the python process to pause one for a benchmark.
#
# Only the runs still to do are queued. A machine may come back without this cache (the
# session of 2026-11-25 found it empty, and the original ResNet-56 restarted from epoch 0),
# so a run that has landed leaves the queue in the commit that lands it: the recipe search
# (issue 26 item 1, its results in docs/zoo.md) and the pre-activation and original
# ResNet-20 and ResNet-56 (keras_preact/weights/) are done.
#
# The zoo (issue 26 item 3): the chosen recipe, all 50,000 training JPEGs, tested on the
# 10,000 test JPEGs; each lands (scripts/land_zoo_run.py) as soon as it finishes. Rates
# measured alone (bench/training_throughput.py --config cifar10_zoo, 2026-11-24): ResNet-56
# 268 images/s (3.1 hours), ResNet-110 141 (5.9 hours).
set -u
cd "$(dirname "$0")/.."
RUNS=${RUNS:-$HOME/.cache/keras-preact/runs}
DATA=${DATA:-$HOME/.cache/keras-preact/cifar10-jpeg}
PYTHON=${PYTHON:-.venv/bin/python}

QUEUE=(
  "zoo-resnet110|--config cifar10_zoo --model resnet110"
  "zoo-resnet164|--config cifar10_zoo --model resnet164"
  "zoo-resnet110-original|--config cifar10_zoo --model resnet110_original"
  "zoo-resnet164-original|--config cifar10_zoo --model resnet164_original"
)

mkdir -p "$RUNS"
for entry in "${QUEUE[@]}"; do
  name=${entry%%|*}
  arguments=${entry#*|}
  [ -f "$RUNS/$name/summary.json" ] && continue
  mkdir -p "$RUNS/$name"
  echo "$(date -u +%FT%TZ) start $name: $arguments" >> "$RUNS/queue.log"
  # shellcheck disable=SC2086  (the arguments are words)
  nice -n 10 "$PYTHON" -m training train $arguments --data-dir "$DATA" --run-dir "$RUNS/$name" \
    > "$RUNS/$name/output.txt" 2>&1
  status=$?
  echo "$(date -u +%FT%TZ) end $name: exit $status" >> "$RUNS/queue.log"
  [ "$status" -eq 0 ] || exit "$status"
done
