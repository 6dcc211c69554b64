import torch


def rotate_pair(a: torch.Tensor, b: torch.Tensor, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn every 2-D point (a, b) counter-clockwise by the angle theta (radians); return the turned (a, b)."""
    raise NotImplementedError("your code here")
