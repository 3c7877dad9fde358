"""Stand-in for AutoRound's SignSGD: p -= lr * sign(g), with optional momentum on g."""
import torch


class SignSGD(torch.optim.Optimizer):
    def __init__(self, params, lr, momentum=0, weight_decay=0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if group["momentum"]:
                    buf = self.state[p].setdefault("momentum", torch.zeros_like(g))
                    g = buf.mul_(group["momentum"]).add_(g)
                p.add_(torch.sign(g), alpha=-float(group["lr"]))
