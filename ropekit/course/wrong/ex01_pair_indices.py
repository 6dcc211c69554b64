"""Deliberately wrong answers to exercise 01_pair_indices, one per diagnosis (used by tests/test_course.py only)."""

import torch


def pair_indices_always_neighbours(rotary_dim, interleaved):
    """GPT-J's map for both pairings."""
    pairs = torch.arange(rotary_dim // 2)
    return 2 * pairs, 2 * pairs + 1


def pair_indices_swapped(rotary_dim, interleaved):
    """(second, first): the same channels, but each pair turns the other way."""
    pairs = torch.arange(rotary_dim // 2)
    if interleaved:
        return 2 * pairs + 1, 2 * pairs
    return pairs + rotary_dim // 2, pairs


def pair_indices_float(rotary_dim, interleaved):
    """The right channels as float32 numbers (rotary_dim / 2 makes torch.arange return floats)."""
    pairs = torch.arange(rotary_dim / 2)
    if interleaved:
        return 2 * pairs, 2 * pairs + 1
    return pairs, pairs + rotary_dim / 2


WRONG = {"other_pairing": pair_indices_always_neighbours, "wrong_direction": pair_indices_swapped,
         "wrong": pair_indices_float}
