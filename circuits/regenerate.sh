#!/usr/bin/env bash
# Regenerate the exported circuits of the shipped organism cases (run from the repository root).
set -euo pipefail
for c in induction_organism threshold_organism; do
  extra=""; [ "$c" = threshold_organism ] && extra="--faithfulness 1.0"
  surgeon circuit "cases/$c.py" $extra --threads 1 --paths 5 \
    --export "circuits/$c.graphml" "circuits/$c.gexf" "circuits/$c.json" "circuits/$c.mib.json" \
             "circuits/$c.dot" "circuits/$c.tex" "circuits/$c.png" > "circuits/$c.txt"
done
