"""The end-to-end check: a transformers model decoded through ropekit's fused pre-processing and a paged cache.

:class:`PagedDecoder` runs a Hugging Face Llama or Qwen3 (any size; the check builds tiny random ones from their
configs) with the model's own weights, but replaces each attention's pre-processing by one
:func:`ropekit.rope_and_cache` launch per layer: q and k rotated (after the per-head RMSNorm when the model has one,
Qwen3's ``q_norm``/``k_norm``), and the rotated k and the untouched v written into a paged cache at ``slot_mapping``.
Attention then reads the cache through :func:`ropekit.paged.paged_attention` (a reference in PyTorch).

:func:`decode_check` prefills a batch of prompts of different lengths, decodes greedily, runs transformers' own forward
over the same token sequences, and reports the largest logit differences, also against the float64 model, so that the
bound a test asserts can be stated relative to transformers' own rounding in the same dtype.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from .fused import rope_and_cache
from .frequencies import cos_sin_table, rope_init, rope_parameters_from_config
from .paged import BlockAllocator, paged_attention, slot_mapping

__all__ = ["FAMILIES", "tiny_model", "PagedDecoder", "DecodeResult", "decode_check", "main"]

FAMILIES = ("llama", "qwen3")


def tiny_model(family: str, *, dtype=torch.float32, device=None, seed: int = 0, layers: int = 2):
    """A random transformers ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` (hidden 64, 4 query / 2 kv heads of 16,
    vocabulary 256), eager attention, in eval mode. Weights are drawn larger than transformers' default (std 0.15,
    not 0.02), so that attention is far from uniform and a position off by one changes the logits; the RMSNorm
    weights are drawn around 1 (transformers initialises them to exactly 1), so that a wrong norm weight shows."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.15)
    if family == "llama":
        config = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.Qwen3Config(**common)
        cls = transformers.Qwen3ForCausalLM
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
    return model.to(device=device, dtype=dtype).eval()


class PagedDecoder:
    """Runs a Llama/Qwen3 ``model`` (``*ForCausalLM``) step by step on a paged KV cache written by ropekit.

    ``step(tokens)`` takes, per sequence, the list of its new token ids (the whole prompt at prefill, one id while
    decoding; an empty list leaves a sequence out of the step) and returns their logits packed in order
    ``(tokens, vocab)``.
    """

    def __init__(self, model, n_seqs: int, *, block_size: int = 16, num_blocks: int = 64, seed: int = 0):
        config = model.config
        self.model = model
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        device, dtype = model.lm_head.weight.device, model.lm_head.weight.dtype
        params = rope_parameters_from_config(config)
        inv_freq, scaling = rope_init(params, params["rotary_dim"])
        self.cos, self.sin = cos_sin_table(config.max_position_embeddings, inv_freq=inv_freq,
                                           attention_scaling=scaling, device=device)
        shape = (num_blocks, block_size, self.n_kv, self.head_dim)
        self.k_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in model.model.layers]
        self.v_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in model.model.layers]
        self.blocks = BlockAllocator(num_blocks, block_size, n_seqs, seed=seed)

    @torch.no_grad()
    def step(self, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        device = self.model.lm_head.weight.device
        seq_ids, positions = [], []
        for seq, ids in enumerate(tokens):
            positions += self.blocks.append(seq, len(ids))
            seq_ids += [seq] * len(ids)
        seq_ids_t = torch.tensor(seq_ids, device=device)
        positions_t = torch.tensor(positions, device=device)
        tables = self.blocks.block_tables(device)
        slots = slot_mapping(tables, seq_ids_t, positions_t, self.blocks.block_size)
        query_lens = [len(ids) for ids in tokens]
        context_lens = list(self.blocks.lens)
        ids = torch.tensor([t for seq in tokens for t in seq], device=device)
        x = self.model.model.embed_tokens(ids)
        for layer, k_cache, v_cache in zip(self.model.model.layers, self.k_caches, self.v_caches):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(1, -1, self.n_heads, self.head_dim)
            k = attn.k_proj(h).view(1, -1, self.n_kv, self.head_dim)
            v = attn.v_proj(h).view(1, -1, self.n_kv, self.head_dim)
            norm = {}
            if getattr(attn, "q_norm", None) is not None:
                norm = dict(q_weight=attn.q_norm.weight, k_weight=attn.k_norm.weight,
                            eps=attn.q_norm.variance_epsilon)
            rope_and_cache(q, k, v, self.cos, self.sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                           positions=positions_t[None], inplace=True, **norm)
            o = paged_attention(q[0], k_cache, v_cache, tables, context_lens, query_lens, scale=attn.scaling)
            x = x + attn.o_proj(o.reshape(o.shape[0], -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.lm_head(self.model.model.norm(x))


@dataclass
class DecodeResult:
    family: str
    dtype: str
    steps: int
    prompt_lens: tuple
    block_size: int
    max_abs_vs_transformers: float  # ropekit's logits against transformers' forward in the same dtype
    max_abs_ropekit_vs_float64: float  # ropekit's logits against the float64 model
    max_abs_transformers_vs_float64: float  # transformers' own rounding in this dtype
    logit_scale: float  # max |logit| of the float64 model (for relative statements)
    tokens: list

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _full_logits(model, sequences, dtype) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(input_ids=torch.tensor([s], device=model.device)).logits[0].to(dtype) for s in sequences]


def decode_check(family: str, dtype=torch.float32, *, steps: int = 32, prompt_lens: Sequence[int] = (5, 11),
                 block_size: int = 16, device=None, seed: int = 0,
                 model: Optional[torch.nn.Module] = None) -> DecodeResult:
    """Prefill ``prompt_lens`` random prompts, decode ``steps`` tokens greedily through :class:`PagedDecoder`, and
    compare every position's logits with transformers' forward over the same tokens (in ``dtype`` and float64)."""
    model = tiny_model(family, dtype=dtype, device=device, seed=seed) if model is None else model
    device = model.lm_head.weight.device
    generator = torch.Generator().manual_seed(seed + 1)
    vocab = model.config.vocab_size
    sequences = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in prompt_lens]
    num_blocks = 2 * len(prompt_lens) * (-(-(max(prompt_lens) + steps + 1) // block_size))
    decoder = PagedDecoder(model, len(prompt_lens), block_size=block_size, num_blocks=num_blocks, seed=seed)
    logits = decoder.step(sequences)
    per_seq = [list(chunk) for chunk in logits.split(list(prompt_lens))]
    for _ in range(steps):
        new = [[int(rows[-1].argmax())] for rows in per_seq]
        for seq, ids in enumerate(new):
            sequences[seq] += ids
        step_logits = decoder.step(new)
        for rows, row in zip(per_seq, step_logits):
            rows.append(row)
    ours = [torch.stack(rows).double() for rows in per_seq]
    theirs = _full_logits(model, sequences, torch.float64)
    exact = _full_logits(model.to(torch.float64), sequences, torch.float64)
    model.to(dtype)

    def worst(a, b):
        return max(float((x - y).abs().max()) for x, y in zip(a, b))

    return DecodeResult(family=family, dtype=str(dtype).replace("torch.", ""), steps=steps,
                        prompt_lens=tuple(prompt_lens), block_size=block_size,
                        max_abs_vs_transformers=worst(ours, theirs), max_abs_ropekit_vs_float64=worst(ours, exact),
                        max_abs_transformers_vs_float64=worst(theirs, exact),
                        logit_scale=max(float(x.abs().max()) for x in exact), tokens=sequences)


def main(argv=None) -> int:
    """``python -m ropekit.model_check --out DIR``: the check for both families in float32 and bfloat16, written to
    ``DIR/model_check.json`` (the bound a test asserts, measured)."""
    from .device import DEVICE

    parser = argparse.ArgumentParser(prog="python -m ropekit.model_check", description=main.__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args(argv)
    results = []
    for family in FAMILIES:
        for dtype in (torch.float32, torch.bfloat16):
            result = decode_check(family, dtype, steps=args.steps, prompt_lens=(5, 11, 40), block_size=16,
                                  device=DEVICE).to_json()
            result.pop("tokens")
            print(result)
            results.append(result)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (Triton interpreter)"
    (args.out / "model_check.json").write_text(json.dumps({"device": device, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
