#!/usr/bin/env bash
# The CPU's training queue: the runs of scripts/queue.txt marked "cpu", in order. Each session
# starts it again (`nohup scripts/zoo_queue.sh &`), and it resumes the first unfinished run
# from its last checkpoint (a run is finished when its folder holds summary.json).
# Run it from a clone of main outside the work tree (git clone . ~/.cache/keras-preact/runner;
# with PYTHON=<work tree>/.venv/bin/python), so that edits in progress never change a queued run.
# Runs go to ~/.cache/keras-preact/runs/<name>, at nice 10 so that tests come first;
# `kill -STOP` / `kill -CONT` the python process to pause one for a benchmark. A run is
# checkpointed every fifth of an epoch (queue.txt's checkpoint_every=78), so stopping it loses
# at most that.
#
# The data is CIFAR-10 as JPEG folders in ~/.cache/keras-preact/cifar10-jpeg, made once by
# `.venv/bin/keras-preact data ../shared/data/cifar10-jpeg.tar.xz` (as the tests make it; its
# cifar10-jpeg.done mark tells them it is there). A machine may come back without ~/.cache: the
# runs then start again from their first step.
#
# Each finished run lands at once (scripts/land_zoo_run.py, with its rate measured alone by
# bench/training_throughput.py --config cifar10_zoo) and leaves scripts/queue.txt in the same
# commit. A lent GPU trains the same queue (scripts/gpu_playbook.py), and its checkpoints
# land in the same run folders, where this queue resumes them.
set -u
cd "$(dirname "$0")/.."
RUNS=${RUNS:-$HOME/.cache/keras-preact/runs}
DATA=${DATA:-$HOME/.cache/keras-preact/cifar10-jpeg}
PYTHON=${PYTHON:-.venv/bin/python}

# The runner's own packages under their installed names (training/ is keras_preact_training), ahead
# of the editable install of the work tree that $PYTHON's environment holds.
PACKAGES=$(mktemp -d)
trap 'rm -rf "$PACKAGES"' EXIT
ln -s "$PWD/keras_preact" "$PACKAGES/keras_preact"
ln -s "$PWD/training" "$PACKAGES/keras_preact_training"
export PYTHONPATH="$PACKAGES${PYTHONPATH:+:$PYTHONPATH}"

mapfile -t QUEUE < <(grep -v '^#' scripts/queue.txt | awk -F'|' '$2 ~ /cpu/')
mkdir -p "$RUNS"
for entry in "${QUEUE[@]}"; do
  name=$(echo "$entry" | cut -d'|' -f1 | xargs)
  arguments=$(echo "$entry" | cut -d'|' -f3 | xargs)
  [ -f "$RUNS/$name/summary.json" ] && continue
  mkdir -p "$RUNS/$name"
  echo "$(date -u +%FT%TZ) start $name: $arguments" >> "$RUNS/queue.log"
  # shellcheck disable=SC2086  (the arguments are words)
  nice -n 10 "$PYTHON" -m keras_preact_training train $arguments --data-dir "$DATA" --run-dir "$RUNS/$name" \
    < /dev/null >> "$RUNS/$name/output.txt" 2>&1
  status=$?
  echo "$(date -u +%FT%TZ) end $name: exit $status" >> "$RUNS/queue.log"
  [ "$status" -eq 0 ] || exit "$status"
done
