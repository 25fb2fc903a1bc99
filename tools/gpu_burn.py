"""Load for the GPU round's race step: 150 s of 4096x4096 matmuls on the current GPU."""
import time, torch
a = torch.randn(4096, 4096, device="cuda"); t = time.time()
while time.time() - t < 150:
    for _ in range(20): a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
