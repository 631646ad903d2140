# linear_attn: is the compiled-vs-eager gradient gap of the GPU test compilation, or bf16 conditioning? eager bf16 vs eager fp32
import sys; sys.path[:0] = [".", "tests"]
import copy, torch
from test_gpu import _model, _rel
for bb in ["linear_attn", "retnet"]:
    m = _model(bb); x = torch.randint(0, 512, (4, 257), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    out = {}
    for name, ac, mod in (("fp32", False, m), ("bf16", True, m), ("bf16_compiled", True, torch.compile(copy.deepcopy(m)))):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=ac):
            loss = mod(x[:, :-1], x[:, 1:])[1]
        ps = [p for p in (mod.parameters())]
        out[name] = torch.cat([g.flatten().float() for g in torch.autograd.grad(loss, ps)])
    print(bb, "rel(bf16 eager, fp32)", _rel(out["bf16"], out["fp32"]), "rel(bf16 compiled, fp32)", _rel(out["bf16_compiled"], out["fp32"]), "rel(compiled, eager)", _rel(out["bf16_compiled"], out["bf16"]))
