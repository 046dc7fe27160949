"""One training step of real models (random weights from configs, no download), as built and
after normscan.convert: transformers' Llama (bf16 autocast, fp32 weights, AdamW), timm's
resnet50 (BatchNorm2d) and convnext_tiny (LayerNorm2d, with layer_norm_like). Median of --steps steps timed with CUDA events after warm-up, host
time included (each step is launched and waited on as a training loop does).

Usage: python tools/model_step.py [--steps 10]
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

import normscan


def _step_ms(model, batch, loss_of, steps: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(model, batch)
        loss.backward()
        opt.step()
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _llama():
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
                                      num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048)
    model = transformers.LlamaForCausalLM(config).cuda()
    tokens = torch.randint(0, 32000, (2, 2048), device="cuda")
    return ("Llama (hidden 2048, 4 layers, 2x2048 tokens)", model, {LlamaRMSNorm: normscan.rms_norm_like}, tokens,
            lambda m, t: m(t, labels=t).loss)


def _resnet():
    import timm

    model = timm.create_model("resnet50", pretrained=False, num_classes=1000).cuda()
    batch = (torch.randn(64, 3, 224, 224, device="cuda"), torch.randint(0, 1000, (64,), device="cuda"))
    return ("timm resnet50 (BatchNorm2d, 64x3x224x224)", model, {}, batch,
            lambda m, b: torch.nn.functional.cross_entropy(m(b[0]).float(), b[1]))


def _convnext():
    import timm
    from timm.layers import LayerNorm2d

    model = timm.create_model("convnext_tiny", pretrained=False, num_classes=1000).cuda()
    batch = (torch.randn(64, 3, 224, 224, device="cuda"), torch.randint(0, 1000, (64,), device="cuda"))
    return ("timm convnext_tiny (LayerNorm2d, LayerNorm, 64x3x224x224)", model, {LayerNorm2d: normscan.layer_norm_like},
            batch, lambda m, b: torch.nn.functional.cross_entropy(m(b[0]).float(), b[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; training step ms, median of {args.steps}")
    print("| model | torch.nn ms | normscan ms | modules swapped |")
    print("|---|---:|---:|---:|")
    for make in (_llama, _resnet, _convnext):
        name, model, replace, batch, loss_of = make()
        converted = copy.deepcopy(model)
        swapped = normscan.convert(converted, replace=replace)
        theirs = _step_ms(model, batch, loss_of, args.steps)
        ours = _step_ms(converted, batch, loss_of, args.steps)
        print(f"| {name} | {theirs:.2f} | {ours:.2f} | {len(swapped)} |", flush=True)
        del model, converted
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
