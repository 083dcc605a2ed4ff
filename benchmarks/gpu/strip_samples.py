"""Shrink lm-eval sample logs to what `eval recall table` / `eval compare` read (the prompts are regenerable from the
recall seed), so runs fit the device's return limit."""
import json
import sys
from pathlib import Path

KEEP = ("doc_id", "doc_hash", "filter", "metrics", "acc", "acc_norm", "exact_match", "filtered_resps", "target")
for root in sys.argv[1:]:
    for f in Path(root).rglob("samples_*.jsonl"):
        lines = [json.dumps({k: v for k, v in json.loads(line).items() if k in KEEP})
                 for line in f.read_text().splitlines() if line.strip()]
        f.write_text("\n".join(lines) + "\n")
