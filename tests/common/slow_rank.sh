#!/bin/bash
# slow_rank.sh PID: slow a running rank down for real (no flag in the trainer) until it exits: SIGSTOP for
# 80-200 ms, SIGCONT for 20-80 ms, again. The durations are random so the stops do not lock onto the step's
# rhythm: with a fixed cycle (0.25 s / 0.08 s) one CI run landed every stop inside the rank's own
# communication waits, which count as waiting, and no window named the rank. Prints the number of stops.
set -u
pid=$1 n=0
while kill -STOP "$pid" 2>/dev/null; do
  n=$((n + 1))
  sleep "0.$(printf %03d $((80 + RANDOM % 121)))"
  kill -CONT "$pid" 2>/dev/null
  sleep "0.0$((2 + RANDOM % 7))"
done
echo "$n"
