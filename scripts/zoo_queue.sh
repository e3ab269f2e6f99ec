#!/usr/bin/env bash
# The CPU's training queue: the runs of scripts/queue.txt marked "cpu", in order. Each session
# starts it again and it resumes the first unfinished run from its last checkpoint (a run is
# finished when its folder holds summary.json). It reads queue.txt again after every run, so
# that runs added to the runner's clone (`git -C ~/.cache/keras-preact/runner pull`) are taken
# without a restart.
#
# Run it from a clone of main outside the work tree, so that edits in progress never change a
# queued run:
#
#   git clone . ~/.cache/keras-preact/runner
#   cd ~/.cache/keras-preact/runner && PYTHON=/work/main/.venv/bin/python nohup scripts/zoo_queue.sh &
#
# Runs go to ~/.cache/keras-preact/runs/<name> (its output.txt, log.csv, checkpoints; the
# queue's own log in runs/queue.log), at nice 10 so that tests come first; `kill -STOP` /
# `kill -CONT` the python process to pause one for a benchmark, and for the whole test suite:
# beside a training run the suite took 46.7 minutes against 37.4 with the run paused
# (docs/benchmarks.md), while the run got about a quarter of its speed, so pausing costs the
# queue no more than it gives back and ends the check sooner. A run is checkpointed every
# fifth of an epoch (queue.txt's checkpoint_every=78), so stopping it loses at most that.
#
# The data is CIFAR-10 with its original pixels, as PNG folders in
# ~/.cache/keras-preact/cifar10-png, made once by
# `.venv/bin/keras-preact data ../shared/data/cifar10-png.tar.xz` (as the tests make it; its
# mark inside, .keras-preact-data, tells them it is there); the CIFAR-100 runs name their own --data-dir,
# ~/.cache/keras-preact/cifar100-png, made once by
# `.venv/bin/keras-preact data ../shared/data/cifar100-png.tar.xz`. A machine may come back without ~/.cache and
# without the work tree's ignored files: then `make .venv/installed` (the environment $PYTHON
# names), the data commands above and the runner's clone again (scripts/queue.txt holds only the
# runs still to do, so none finished is redone). So that a run longer than a session goes on from
# where the last session stopped it, that session stops the queue after a checkpoint and commits
# the runs it has begun (`.venv/bin/python -m scripts.carry_runs save`, into scripts/carried/),
# and this script, starting, restores them into their run folders.
#
# Each finished zoo run lands at once (scripts/land_zoo_run.py, with its rate measured alone by
# bench/training_throughput.py --config cifar10_zoo; a second seed with --another-seed, into its
# network's entry) and leaves scripts/queue.txt in the same commit; the recipe search's runs
# (recipe-*, confirm-*) are compared by `keras-preact compare`. A lent GPU trains the same queue
# (scripts/gpu_playbook.py), and its checkpoints land in the same run folders, where this queue
# resumes them.
set -u
cd "$(dirname "$0")/.."
RUNS=${RUNS:-$HOME/.cache/keras-preact/runs}
DATA=${DATA:-$HOME/.cache/keras-preact/cifar10-png}
PYTHON=${PYTHON:-.venv/bin/python}
CARRIED=${CARRIED:-scripts/carried}

# The runner's own packages, ahead of the editable install of the work tree that $PYTHON's
# environment holds.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# The first run of queue.txt marked "cpu" whose folder holds no summary.json, as "name|arguments".
next_run() {
  grep -v '^#' scripts/queue.txt | awk -F'|' '$2 ~ /cpu/' | while IFS='|' read -r name where arguments; do
    name=$(echo "$name" | xargs)
    [ -f "$RUNS/$name/summary.json" ] || { echo "$name|$(echo "$arguments" | xargs)"; break; }
  done
}

mkdir -p "$RUNS"
# Runs begun on another machine and carried in the repository (scripts/carry_runs.py), each
# into its run folder where it is further on than the folder's own.
if compgen -G "$CARRIED/*.tar" > /dev/null; then
  "$PYTHON" -m scripts.carry_runs restore --carried "$CARRIED" --runs "$RUNS" --data-dir "$DATA" >> "$RUNS/queue.log" 2>&1 ||
    exit
fi
while entry=$(next_run) && [ -n "$entry" ]; do
  name=${entry%%|*}
  arguments=${entry#*|}
  # A leading ~ in the arguments (a run's own --data-dir) is this user's home, as in a shell.
  arguments=${arguments//\~\//$HOME/}
  mkdir -p "$RUNS/$name"
  echo "$(date -u +%FT%TZ) start $name: $arguments" >> "$RUNS/queue.log"
  # A run that names its own --data-dir in queue.txt keeps it; the others read $DATA.
  data=(--data-dir "$DATA")
  case " $arguments " in *" --data-dir "*) data=() ;; esac
  # shellcheck disable=SC2086  (the arguments are words)
  nice -n 10 "$PYTHON" -m keras_preact_training train $arguments "${data[@]}" --run-dir "$RUNS/$name" \
    < /dev/null >> "$RUNS/$name/output.txt" 2>&1
  status=$?
  echo "$(date -u +%FT%TZ) end $name: exit $status" >> "$RUNS/queue.log"
  [ "$status" -eq 0 ] || exit "$status"
done
