#!/usr/bin/env bash
# CPU of the NATS servers and the tidemark node during one 16 x 1 append cell on the cluster.
cd "$(dirname "$0")/.."
export PATH="$PATH:$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
for S in 1 4; do
  ${BENCH:-./target/release/tidemark-bench} --systems tidemark-jetstream --workloads append --clients 16 --batches 1 \
    --events 100000 --cell-seconds 6 --no-fsync-count --shards $S --tidemark-bin ${SERVER:-./target/release/tidemark} \
    --json-out ${OUT:-/tmp}/split-s$S.json > ${OUT:-/tmp}/split-s$S.log 2>&1 &
  bp=$!
  : > ${OUT:-/tmp}/split-s$S.samples
  while kill -0 $bp 2>/dev/null; do
    for p in $(pgrep -x nats-server) $(pgrep -f "tidemark serve"); do
      comm=$(cat /proc/$p/comm 2>/dev/null) || continue
      t=$(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null) || continue
      echo "$(date +%s.%N) $p $comm $t" >> ${OUT:-/tmp}/split-s$S.samples
    done
    sleep 0.5
  done
done
echo "samples in ${OUT:-/tmp}/split-s{1,4}.samples (time, pid, command, utime+stime ticks)"
