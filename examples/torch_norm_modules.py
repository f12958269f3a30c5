"""resnorm.torch's RMSNorm as a drop-in for torch.nn.RMSNorm in a small PyTorch model.

The module takes torch's constructor arguments and state_dict keys, runs resnorm's
kernels on the CPU tensors without copying them, and autograd differentiates through it:
the outputs and gradients agree with torch's own module to float32 rounding.  Needs torch.
"""
import torch

import resnorm.torch as rt

torch.manual_seed(0)
x = torch.randn(8, 64, 256)
target = torch.randn(8, 64, 256)   # a loss that depends on the direction of y
models = {}
for name, norm in (("torch", torch.nn.RMSNorm(256, eps=1e-6)),
                   ("resnorm", rt.RMSNorm(256, eps=1e-6))):
    torch.manual_seed(1)   # the same Linear weights in both
    models[name] = torch.nn.Sequential(torch.nn.Linear(256, 256), norm)

outputs, grads = {}, {}
for name, model in models.items():
    y = model(x)
    ((y - target) ** 2).mean().backward()
    outputs[name], grads[name] = y, model[0].weight.grad

err_y = (outputs["resnorm"] - outputs["torch"]).abs().max().item()
err_g = (grads["resnorm"] - grads["torch"]).abs().max().item() / grads["torch"].abs().max().item()
print(f"y: max |resnorm - torch| = {err_y:.1e}; Linear weight gradient: relative {err_g:.1e}")
assert err_y < 1e-5 and err_g < 1e-5
