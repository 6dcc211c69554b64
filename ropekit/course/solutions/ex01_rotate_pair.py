import torch


def rotate_pair(a: torch.Tensor, b: torch.Tensor, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn every 2-D point (a, b) counter-clockwise by the angle theta (radians); return the turned (a, b)."""
    cos, sin = torch.cos(theta), torch.sin(theta)
    # The rotation matrix [[cos, -sin], [sin, cos]] applied to the column (a, b).
    return a * cos - b * sin, b * cos + a * sin
