"""A held-out success sampled at a temperature above 0 is one draw: `trace-gym eval` says so beside the figure
(with the temperature and seed), and the training run's final table says its figures are draws that
`eval --checkpoint` draws again; a greedy evaluation says nothing of the kind."""

from __future__ import annotations

from rich.console import Console

from trace_gym.training.cli.play import summary_table
from trace_gym.training.cli.train import print_summary

SUMMARY = {"command": "eval", "env": "trace/Arithmetic-v0", "env_args": {}, "policy": "runs/quickstart/rl",
           "samples": 1, "branches": 0, "tasks": 200, "episodes": 200, "success": 0.851,
           "success_ci95": [0.795, 0.894], "mixed_tasks": 0, "mean_turns": 2.0, "stop_reasons": {"answer": 200},
           "errors": 0, "first_error": None, "seconds": 12.0, "seed": 0}


def _text(renderable) -> str:
    console = Console(record=True, width=240)
    console.print(renderable)
    return " ".join(console.export_text().split())


def test_a_sampled_success_is_called_a_draw_with_its_temperature_and_seed():
    text = _text(summary_table({**SUMMARY, "temperature": 1.0, "seed": 3}))
    assert "0.851" in text and "temperature 1, seed 3: the success is one draw" in text


def test_a_greedy_success_is_not_called_a_draw():
    assert "draw" not in _text(summary_table({**SUMMARY, "temperature": 0.0}))


def test_the_training_table_says_its_held_out_figures_are_draws():
    summary = {"run_dir": "runs/quickstart/rl", "allocator": "trace", "steps": 20, "success_before": 0.6,
               "success_after": 0.86, "effective_ratio_first": 0.5, "effective_ratio_last": 0.6,
               "effective_ratio_mean": 0.55, "trajectories_per_step": 256, "trajectories": 5120,
               "generated_tokens": 1000, "wall_s": 200.0, "warm_start_s": 300.0}
    console = Console(record=True, width=240)
    print_summary(summary, console)
    text = " ".join(console.export_text().split())
    assert "sampled draws" in text and "eval --checkpoint draws again" in text
    assert "wall time: total (s) │ 500.000" in text
