import torch


def pair_indices(rotary_dim: int, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The channels of the rotary_dim / 2 pairs: return (first, second), two int64 tensors of length rotary_dim / 2,
    so that pair i rotates channels (first[i], second[i]). interleaved=False: NeoX/Llama; True: GPT-J."""
    pairs = torch.arange(rotary_dim // 2)
    if interleaved:
        return 2 * pairs, 2 * pairs + 1  # GPT-J: neighbours
    return pairs, pairs + rotary_dim // 2  # NeoX: the same position in the two halves
