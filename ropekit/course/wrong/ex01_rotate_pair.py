"""Deliberately wrong answers to exercise 01_rotate_pair, one per diagnosis (used by tests/test_course.py only)."""

import torch


def rotate_pair_clockwise(a, b, theta):
    """The transposed matrix: turns by -theta."""
    cos, sin = torch.cos(theta), torch.sin(theta)
    return a * cos + b * sin, b * cos - a * sin


WRONG = {"wrong_direction": rotate_pair_clockwise}
