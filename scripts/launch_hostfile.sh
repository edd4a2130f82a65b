#!/usr/bin/env bash
# Multi-node pretraining (or, with STAGE=finetune, fine-tuning) without a scheduler: one line per node in HOSTFILE
# (first = master), same checkout and run directory path on every node (shared file system), passwordless ssh.
#   scripts/launch_hostfile.sh hostfile --preset 135m --run-dir /shared/runs/135m [--set ranks=8 ...]
#   STAGE=finetune scripts/launch_hostfile.sh hostfile --preset 7b-qlora --base /shared/models/coder --set ft_ranks=8
set -euo pipefail
hostfile=$1; shift
mapfile -t hosts < <(grep -v '^\s*#' "$hostfile" | awk 'NF {print $1}')
[ ${#hosts[@]} -gt 0 ] || { echo "no hosts in $hostfile" >&2; exit 2; }
stage=${STAGE:-pretrain}
case $stage in pretrain) nodes=nodes; default_port=29517 ;; finetune) nodes=ft_nodes; default_port=29518 ;;
  *) echo "STAGE must be pretrain or finetune, got $stage" >&2; exit 2 ;; esac
master=${hosts[0]}; port=${MASTER_PORT:-$default_port}; here=$(pwd)
pids=()
for i in "${!hosts[@]}"; do
  ssh "${hosts[$i]}" "cd $here && .venv/bin/codellm $stage $* --resume --node-rank $i --master-addr $master \
    --master-port $port --set $nodes=${#hosts[@]}" &
  pids+=($!)
done
status=0; for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
