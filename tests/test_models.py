"""Real models built from configs (random weights, no download), converted with
normscan.convert, trained a few steps on the GPU in mixed precision (fp32 weights, bf16
autocast) beside the same model unconverted: each against a float64 copy, ours within twice
the unconverted model's error. tools/model_step.py times their training steps."""

import copy

import pytest
import torch

import normscan
from normscan.bench import testing

pytestmark = pytest.mark.gpu
STEPS = 3


def _train(model, batch, loss_of, autocast: bool) -> list:
    """[logits of the first step, then the loss of each of STEPS SGD steps]."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits, loss = loss_of(model, batch)
        loss.backward()
        opt.step()
        out += ([logits.detach()] if step == 0 else []) + [loss.detach()]
    return out


def _compare(model, converted, batch, loss_of):
    exact = _train(copy.deepcopy(model).double(), batch, loss_of, autocast=False)
    theirs = _train(model, batch, loss_of, autocast=True)
    ours = _train(converted, batch, loss_of, autocast=True)
    for i, (o, t, e) in enumerate(zip(ours, theirs, exact)):
        what = "logits" if i == 0 else f"loss after {i - 1} steps"
        error, mismatch = testing.rel_error(o, e)
        their_error = testing.rel_error(t, e)[0]
        assert not mismatch and error <= max(2 * their_error, 2 * testing.UNIT_ROUNDOFF[torch.bfloat16]), \
            (what, error, their_error)


def test_a_llama_trains_as_with_torch_nn():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).cuda()
    converted = copy.deepcopy(model)
    assert len(normscan.convert(converted, replace={LlamaRMSNorm: normscan.rms_norm_like})) == 2 * 2 + 1
    tokens = torch.randint(0, 512, (4, 96), device="cuda")

    def loss_of(m, tokens):
        out = m(tokens, labels=tokens)
        return out.logits, out.loss
    _compare(model, converted, tokens, loss_of)


def test_a_timm_resnet_with_batch_norm_trains_as_with_torch_nn():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10).cuda()
    converted = copy.deepcopy(model)
    swapped = normscan.convert(converted)
    assert swapped and all("BatchNorm2d -> normscan.BatchNorm2d" in s for s in swapped), swapped
    images = torch.randn(8, 3, 64, 64, device="cuda")
    labels = torch.randint(0, 10, (8,), device="cuda")

    def loss_of(m, batch):
        logits = m(batch[0].to(next(m.parameters()).dtype))
        return logits, torch.nn.functional.cross_entropy(logits.float() if logits.dtype != torch.float64 else logits,
                                                         batch[1])
    _compare(model, converted, (images, labels), loss_of)
