"""Final-state and output error of fused SSD (split in two) against the fp64 recurrence over seeds, 'large' dt."""
import sys, os
sys.path.insert(0, os.getcwd())
import torch
import ops.common.chunk_h as ch
ch.MIN_SEGMENT_CHUNKS = 4
from tests.ops.test_ssd import make_inputs
from tests.helpers import rel_err
from ops.ssd.naive import ssd_recurrent
from ops import get_op
rows = []
for seed in range(int(sys.argv[1])):
    inputs = [t.float() for t in make_inputs(1, 600, 1, 8, 1, 8, "large", seed=seed)]
    y1, h1 = ssd_recurrent(*(t.double() for t in inputs[:5]), initial_state=inputs[5].double(), output_final_state=True)
    y2, h2 = get_op("ssd", "fused")(*(t.cuda() for t in inputs[:5]), initial_state=inputs[5].cuda(), output_final_state=True)
    rows.append((rel_err(h2.cpu(), h1), rel_err(y2.cpu(), y1), seed, inputs[2].item()))
rows.sort(reverse=True)
print(sys.argv[2], "over 1e-5:", sum(r[0] >= 1e-5 for r in rows), "of", len(rows), "| worst h/y@seed(A):",
      [f"{h:.2e}/{y:.2e}@{s}({a:.1f})" for h, y, s, a in rows[:4]], "| median h", f"{rows[len(rows)//2][0]:.1e}")
