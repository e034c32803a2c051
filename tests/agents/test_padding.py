"""The padding helper: rows padded right or left with the value, an attention mask over the real elements."""

import torch

from trace_gym.agents.padding import attention_mask, pad_rows


def test_right_and_left_padding_by_hand():
    rows = [[5, 6, 7], [8]]
    assert pad_rows(rows, 0).tolist() == [[5, 6, 7], [8, 0, 0]]
    assert pad_rows(rows, 0, left=True).tolist() == [[5, 6, 7], [0, 0, 8]]
    assert attention_mask(rows).tolist() == [[1, 1, 1], [1, 0, 0]]
    assert attention_mask(rows, left=True).tolist() == [[1, 1, 1], [0, 0, 1]]


def test_a_wider_width_and_another_dtype():
    out = pad_rows([[True], [False, True]], False, torch.bool, width=4)
    assert out.dtype == torch.bool and out.tolist() == [[True, False, False, False], [False, True, False, False]]
    assert pad_rows([[0.5]], 0.0, torch.float32).dtype == torch.float32
