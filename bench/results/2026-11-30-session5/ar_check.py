# Run 2's prepared all-reduce comparison: PreparedAllReduce.run through the torch bridge
# against the same plan replayed with streams read through ctypes (the class's own run).
# From the repository root on the GPU machine, dist/ beside it.
import sys
sys.path.insert(0, "python")
sys.path.insert(0, "bench")
import torch  # noqa: E402
import qlink  # noqa: E402
from timing import mean_us  # noqa: E402
qlink.configure({"backend": "cuda", "log_level": "warn"}, library="dist/libqlink.so").enable_peer_access()
print("bridge bound:", qlink._bridge.gpu() is not None)
for size in [1 << 16, 1 << 20]:
    bufs = [torch.randn(size // 4, device=d) for d in range(2)]
    plan = qlink.PreparedAllReduce(bufs)
    for r in range(3):
        b = mean_us(plan.run)
        c = mean_us(lambda: qlink.PreparedAllReduce.run(plan))
        print("prepared all-reduce fp32 %8d B: bridge %.1f us, ctypes streams %.1f us" % (size, b, c))
