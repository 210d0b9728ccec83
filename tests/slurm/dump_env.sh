#!/bin/sh
# One line per task: the variables the plugin sets, plus Slurm's own view of the task.
printf 'MESHENV'
env | grep -E '^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|MESHRUN_[A-Z_]+|CUDA_VISIBLE_DEVICES|NCCL_[A-Z_]+|SLURM_PROCID|SLURM_LOCALID|SLURM_NODEID|SLURMD_NODENAME|SLURM_JOB_NODELIST|SLURM_STEP_GPUS)=' |
  sort | while IFS= read -r kv; do printf ' %s' "$kv"; done
printf '\n'
