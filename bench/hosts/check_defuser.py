"""The defuser stand-in against transformers' real Qwen3-MoE (issue 20, on the GPU machine):
one layer's fused block and its split copy on the same tokens, for each experts
implementation transformers offers; the split weights against the fused slices; then how
make_qwen3_moe's checkpoint stores layer 0's experts (per expert, or fused), which decides
whether GPTQModel's layer-by-layer load finds the split tree's keys.
    python3 check_defuser.py [--model DIR]
"""
import argparse
import copy
import glob

from common import setup_paths

setup_paths()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/tmp/qwen3moe-2layers")
    a = ap.parse_args()
    import defuser
    import torch
    import transformers
    from common import make_qwen3_moe
    from safetensors import safe_open
    print("transformers", transformers.__version__)
    cfg = transformers.Qwen3MoeConfig(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                      num_hidden_layers=1, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                      num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, vocab_size=32000)
    model = transformers.Qwen3MoeForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    block = model.model.layers[0].mlp
    with torch.no_grad():
        block.gate.weight.normal_(0, 0.02)
    print(type(block.experts).__name__, {n: tuple(p.shape) for n, p in block.experts.named_parameters()})
    split = copy.deepcopy(block)
    print("converted:", defuser.convert_model(split))
    # batched_mm gathers each (token, expert) pair's weights: 256 tokens x 8 experts fit
    x = torch.randn(2, 128, 2048, device="cuda", dtype=torch.bfloat16)
    torch.use_deterministic_algorithms(True, warn_only=True)  # the eager loop's index_add_
    for impl in ("eager", "batched_mm", "grouped_mm"):
        cfg._experts_implementation = impl
        try:
            with torch.no_grad():
                fused, unfused = block(x), split(x)
        except Exception as error:  # noqa: BLE001 (an implementation this version lacks)
            print(impl, "skipped:", error)
            continue
        fused = fused[0] if isinstance(fused, tuple) else fused
        unfused = unfused[0] if isinstance(unfused, tuple) else unfused
        gap = (fused.float() - unfused.float()).abs().max().item()
        print(impl, "equal:", torch.equal(fused, unfused), "max |diff|:", gap)
    e, inter = 5, 768
    gate_up = block.experts.gate_up_proj[e]
    print("weights equal:", torch.equal(split.experts[e].gate_proj.weight, gate_up[:inter]),
          torch.equal(split.experts[e].up_proj.weight, gate_up[inter:]),
          torch.equal(split.experts[e].down_proj.weight, block.experts.down_proj[e]))
    make_qwen3_moe(a.model, 2)
    keys = sorted(k for f in glob.glob(a.model + "/*.safetensors") for k in safe_open(f, "pt").keys()
                  if "layers.0.mlp" in k)
    print("checkpoint keys of layer 0's MoE block:", len(keys), keys[:4])


if __name__ == "__main__":
    main()
