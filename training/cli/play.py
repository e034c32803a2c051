"""What ``trace-gym eval`` and ``trace-gym rollout`` share: any policy on any env, and one report.

    trace-gym eval    --env SPEC [--env-arg KEY=VALUE ...] --policy SPEC [--tasks N] [--samples M] [--out DIR [--trees]]
    trace-gym rollout --env SPEC [--env-arg KEY=VALUE ...] [--policy SPEC] [--branches B] --out FILE.jsonl|DIR

Both play ``--samples`` episodes of each of the env's first ``--tasks`` tasks through one collector
(`evaluate.evaluate_policy`); `rollout` also continues each task's tree ``--branches`` times from visited turns
and writes the trees. ``--policy`` is any spec of `trace_gym.agents.specs` (``expert[:NOISE]``, a model folder,
``hf:PATH``, ``vllm:PATH``, ``openai[:MODEL]`` with ``--base-url``, a server URL); the backend flags map onto
`PolicyOptions`, and a flag the chosen backend would ignore is an error. ``eval --checkpoint/--config``
(training/cli/eval.py) evaluates a run's model and reports through the same `report`.

The report: a summary table with the success and its 95% interval over tasks (or the summary as JSON with
``--json``), progress while it plays (a bar on a terminal, plain lines on stderr otherwise; never with
``--json``), and files under ``--out``: a ``.jsonl`` file receives the command's main output (eval: per-task
rows; rollout: trees); a folder receives ``rows.jsonl``, ``summary.json`` and ``trees.jsonl`` (eval: with
``--trees``), which ``trace-gym view`` renders.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trace_gym.agents.specs import Backend, PolicyOptions, parse_extra_body
from trace_gym.env_specs import parse_env_args
from trace_gym.errors import ConfigError, ServerError
from trace_gym.training.rollout.evaluate import HELD_OUT

if TYPE_CHECKING:
    from rich.console import Console

    from trace_gym.training.rollout.evaluate import EvalResult, RowsFile

# Sampling flags: their defaults per command (eval's are the held-out evaluation's, `evaluate.HELD_OUT`). They are
# None in the parser, so that `eval --checkpoint` can tell a given flag (an override of the run's config,
# CONFIG_KEYS) from an absent one.
DEFAULTS: dict[str, dict[str, Any]] = {
    "eval": {"tasks": HELD_OUT.tasks, "samples": HELD_OUT.samples, "temperature": HELD_OUT.temperature,
             "max_new_tokens": HELD_OUT.max_new_tokens, "seed": 0, "workers": 4, "max_context": HELD_OUT.max_context},
    "rollout": {"tasks": 20, "samples": 1, "branches": 3, "temperature": 1.0, "max_new_tokens": HELD_OUT.max_new_tokens,
                "seed": 0, "workers": 4, "max_context": HELD_OUT.max_context},
}
CONFIG_KEYS = {"tasks": "eval.tasks", "samples": "eval.samples", "temperature": "eval.temperature",
               "max_new_tokens": "rollout.max_new_tokens", "seed": "seed", "workers": "env.workers",
               "max_context": "rollout.max_context"}
# Backend flags: flag -> (PolicyOptions field, the backends that read it).
BACKEND_FLAGS: dict[str, tuple[str, tuple[Backend, ...]]] = {
    "--base-url": ("base_url", ("openai",)), "--model": ("model", ("openai",)),
    "--api-key-env": ("api_key_env", ("openai",)), "--tokenizer": ("tokenizer", ("openai",)),
    "--server": ("server", ("openai",)), "--tool-calls": ("tool_calls", ("openai", "hf", "vllm")),
    "--concurrency": ("concurrency", ("openai",)),
    "--max-retries": ("max_retries", ("openai",)), "--timeout": ("timeout", ("openai",)),
    "--extra-body": ("extra_body", ("openai",)),
    "--device": ("device", ("hf",)), "--dtype": ("dtype", ("hf", "vllm")),
    "--max-model-len": ("max_model_len", ("vllm",)),
}

BACKEND_WORDS: dict[str, str] = {"expert": "the scripted expert", "hf": "a model folder (hf:PATH)",
                                 "vllm": "vllm:PATH", "openai": "a server (openai:MODEL, openai or a URL)"}


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """The env, policy, sampling and output options of ``command`` ("eval" or "rollout")."""
    if command not in DEFAULTS:
        raise ConfigError(f"expected command 'eval' or 'rollout', got {command!r}")
    d = DEFAULTS[command]
    rollout = command == "rollout"
    env = parser.add_argument_group("environment")
    env.add_argument("--env", required=rollout, metavar="SPEC",
                     help="a registered id (trace/Arithmetic-v0; trace-gym envs lists them), module:id or module:Class")
    env.add_argument("--env-arg", action="append", metavar="KEY=VALUE",
                     help="a keyword argument of the env, the value read as YAML (n_tasks=50, split=test, "
                          "max_turns=4); repeat for several")

    pol = parser.add_argument_group("policy", "SPEC: expert, expert:NOISE, a model folder, hf:PATH, vllm:PATH, "
                                              "openai:MODEL or openai (a server at --base-url), or a server URL")
    pol.add_argument("--policy", metavar="SPEC", default="expert:0.3" if rollout else None,
                     help="the policy to play" + (" (expert:0.3 is the env's scripted expert, erring 30%% of the "
                                                  "time)" if rollout else ""))
    opts = PolicyOptions()
    pol.add_argument("--base-url", help="server: base URL ending in /v1 (default: $OPENAI_BASE_URL)")
    pol.add_argument("--model", help="server: the served model name (default: the only one it serves)")
    pol.add_argument("--api-key-env", metavar="VAR",
                     help=f"server: the environment variable holding the API key (default: {opts.api_key_env}; "
                          "a local vllm serve needs none)")
    pol.add_argument("--tokenizer", metavar="PATH", help="server: a local tokenizer; prompts are then sent as "
                                                         "token ids (exact ids, as training records them)")
    pol.add_argument("--server", choices=["auto", "vllm", "openai"],
                     help=f"server: 'vllm' asks for vLLM's extra fields (exact token ids), 'openai' sends the "
                          f"standard ones only, 'auto' asks the server's model list (default: {opts.server})")
    pol.add_argument("--tool-calls", choices=["native", "text"],
                     help="server: 'native' sends the env's tools and reads the answer's tool_calls, a reply "
                          "without them being the final answer (the OpenAI API's form; a hosted model, or vllm serve "
                          "--enable-auto-tool-choice --tool-call-parser hermes); 'text' lets the model write calls "
                          "as text (default: native); model folder, vllm: 'native' renders the tools through the chat "
                          "template and reads Hermes calls, a plain reply being the final answer (default: text)")
    pol.add_argument("--concurrency", type=int, metavar="N",
                     help=f"server: most requests in flight at once (default: {opts.concurrency})")
    pol.add_argument("--max-retries", type=int, metavar="N",
                     help=f"server: retries of a failed request, honouring Retry-After (default: {opts.max_retries})")
    pol.add_argument("--timeout", type=float, metavar="S",
                     help=f"server: seconds per request (default: {opts.timeout:g})")
    pol.add_argument("--extra-body", metavar="JSON",
                     help="server: fields added to every request, e.g. '{\"reasoning_effort\": \"low\"}' (fields "
                          "a hosted reasoning model refuses, max_tokens and logprobs, are adapted without it)")
    pol.add_argument("--device", help=f"model folder: auto, cpu or cuda[:i] (default: {opts.device})")
    pol.add_argument("--dtype", help=f"model folder, vllm: weight dtype, e.g. float32 or bfloat16 "
                                     f"(default: {opts.dtype})")
    pol.add_argument("--max-model-len", type=int, metavar="N",
                     help=f"vllm: the engine's context length (default: {opts.max_model_len})")

    config = " (with --checkpoint/--config: {})" if not rollout else ""
    smp = parser.add_argument_group("sampling")
    smp.add_argument("--tasks", type=int, metavar="N",
                     help=f"play the env's first N tasks, 0 for all (default: {d['tasks']})"
                          + config.format(CONFIG_KEYS["tasks"]))
    smp.add_argument("--samples", type=int, metavar="M",
                     help=f"episodes per task (default: {d['samples']})" + config.format(CONFIG_KEYS["samples"]))
    if rollout:
        smp.add_argument("--branches", type=int, metavar="B",
                         help=f"continuations per tree, each from a uniformly chosen visited turn "
                              f"(default: {d['branches']})")
    smp.add_argument("--temperature", type=float, metavar="T",
                     help=f"sampling temperature, 0 = greedy (default: {d['temperature']:g})"
                          + config.format(CONFIG_KEYS["temperature"]))
    smp.add_argument("--max-new-tokens", type=int, metavar="N",
                     help=f"tokens per turn at most (default: {d['max_new_tokens']})"
                          + config.format(CONFIG_KEYS["max_new_tokens"]))
    smp.add_argument("--seed", type=int, metavar="N",
                     help=f"seed of the samples and the expert's noise (default: {d['seed']})"
                          + config.format(CONFIG_KEYS["seed"]))
    smp.add_argument("--workers", type=int, metavar="N", help=f"env threads (default: {d['workers']})"
                     + config.format(CONFIG_KEYS["workers"]))
    smp.add_argument("--max-context", type=int, metavar="N",
                     help=f"tokens of context at most; a longer episode is cut (default: {d['max_context']})"
                          + config.format(CONFIG_KEYS["max_context"]))

    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, required=rollout, metavar="FILE.jsonl|DIR",
                     help="a .jsonl file for the trees, or a folder for trees.jsonl, rows.jsonl and summary.json"
                     if rollout else "a .jsonl file for the per-task rows, or a folder for rows.jsonl and "
                                     "summary.json (and trees.jsonl with --trees)")
    if not rollout:
        out.add_argument("--trees", action="store_true", help="also write the rollout trees (trace-gym view "
                                                              "renders them); needs a folder --out")
    out.add_argument("--resume", action="store_true",
                     help="continue the run whose rows (or trees) --out holds: its finished episodes are kept and "
                          "not played again, the rest are played (its settings must be these)")
    out.add_argument("--json", action="store_true", help="print the summary as JSON (no table, no progress bar)")


@dataclass(frozen=True)
class PolicyRun:
    """One ``eval``/``rollout`` of a policy on an env, as its flags ask (`policy_run` builds it from them)."""

    command: str
    env: str
    env_args: dict[str, Any]
    policy: str
    options: PolicyOptions
    tasks: int
    samples: int
    branches: int
    temperature: float
    max_new_tokens: int
    seed: int
    workers: int
    max_context: int
    out: Path | None
    keep_trees: bool
    as_json: bool
    resume: bool = False

    def settings(self) -> dict[str, Any]:
        """What decides the episodes played, which ``--resume`` checks against the earlier run's."""
        return {"command": self.command, "env": self.env, "env_args": self.env_args, "policy": self.policy,
                "tasks": self.tasks, "samples": self.samples, "branches": self.branches,
                "temperature": self.temperature, "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                "max_context": self.max_context}


def policy_run(command: str, args: argparse.Namespace) -> PolicyRun:
    """Check ``args`` (parsed by `add_arguments`) and resolve the command's defaults; a wrong flag, spec or
    value raises ``ConfigError`` naming the fix. Nothing is loaded yet but the env spec's module."""
    from trace_gym.agents.specs import backend_of
    from trace_gym.env_specs import resolve_env_spec

    if args.env is None or args.policy is None:
        missing = "--env SPEC" if args.env is None else "--policy SPEC"
        raise ConfigError(f"expected {missing} for trace-gym {command}, got none; fix: e.g. trace-gym {command} "
                          "--env trace/Arithmetic-v0 --policy expert" + (" --out trees.jsonl" if command == "rollout"
                                                                          else ""))
    resolve_env_spec(args.env)
    backend = backend_of(args.policy)
    values = {k: (d if getattr(args, k, None) is None else getattr(args, k)) for k, d in DEFAULTS[command].items()}
    _check_sampling(values)
    options = PolicyOptions(seed=values["seed"])
    for flag, (name, readers) in BACKEND_FLAGS.items():
        value = getattr(args, name)
        if value is None:
            continue
        if backend not in readers:
            raise ConfigError(f"expected {flag} only with {' or '.join(BACKEND_WORDS[r] for r in readers)}, got "
                              f"--policy {args.policy} ({BACKEND_WORDS[backend]}); fix: drop {flag}"
                              + (" or use --policy openai:NAME" if readers == ("openai",) else ""))
        if name == "extra_body":
            value = parse_extra_body(value)
        options = dataclasses.replace(options, **{name: value})
    keep_trees = command == "rollout" or bool(getattr(args, "trees", False))
    out = check_out(args.out, command, keep_trees)
    resume = bool(getattr(args, "resume", False))
    return PolicyRun(command, args.env, parse_env_args(args.env_arg or []), args.policy, options, values["tasks"],
                     values["samples"], values.get("branches", 0), values["temperature"], values["max_new_tokens"],
                     values["seed"], values["workers"], values["max_context"], out, keep_trees, args.json, resume)


def config_overrides(args: argparse.Namespace) -> list[str]:
    """The sampling flags given to ``eval --checkpoint/--config`` as overrides of the run's config (CONFIG_KEYS);
    a policy flag there is a ``ConfigError`` (the run's config names the model and the env)."""
    given = [flag for flag in ("--env", "--policy", *BACKEND_FLAGS) if getattr(args, _dest(flag)) is not None]
    if given or args.env_arg:
        flag = given[0] if given else "--env-arg"
        raise ConfigError(f"expected either a run (--checkpoint/--config) or a policy on an env (--env, --policy), "
                          f"got both ({flag}); fix: drop {flag}, or drop --checkpoint/--config (env settings of a "
                          "run are overrides: env.kwargs.KEY=VALUE)")
    if args.tasks is not None and args.tasks < 1:
        raise ConfigError(f"expected --tasks >= 1 with --checkpoint/--config (it sets eval.tasks), got {args.tasks};"
                          " fix: e.g. --tasks 100")
    return [f"{key}={getattr(args, name)}" for name, key in CONFIG_KEYS.items() if getattr(args, name) is not None]


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _check_sampling(v: dict[str, Any]) -> None:
    bad = [(k, v[k], want) for k, want, ok in (
        ("tasks", ">= 0 (0: all)", v["tasks"] >= 0), ("samples", ">= 1", v["samples"] >= 1),
        ("branches", ">= 0", v.get("branches", 0) >= 0), ("temperature", ">= 0", v["temperature"] >= 0),
        ("max_new_tokens", ">= 1", v["max_new_tokens"] >= 1), ("workers", ">= 1", v["workers"] >= 1),
        ("max_context", ">= 16", v["max_context"] >= 16)) if not ok]
    if bad:
        name, value, want = bad[0]
        flag = "--" + name.replace("_", "-")
        raise ConfigError(f"expected {flag} {want}, got {value}; fix: e.g. {flag} {DEFAULTS['rollout'][name]}")


def check_out(out: Path | None, command: str, keep_trees: bool) -> Path | None:
    """``out`` when it can take the command's outputs (module docstring), else a ``ConfigError``."""
    if out is None:
        if command == "eval" and keep_trees:
            raise ConfigError("expected --out DIR with --trees (the trees go to DIR/trees.jsonl), got no --out; "
                              "fix: add --out results")
        return None
    if out.suffix != ".jsonl" and out.is_file():
        raise ConfigError(f"expected --out to be a .jsonl file or a folder, got the existing file {str(out)!r}; "
                          "fix: name a folder or a .jsonl file")
    if command == "eval" and keep_trees and out.suffix == ".jsonl":
        raise ConfigError(f"expected a folder --out with --trees (rows.jsonl and trees.jsonl go there), got the file "
                          f"{str(out)!r}; fix: --out {out.with_suffix('')}")
    return out


def play(run: PolicyRun, progress: Callable[[int, int], None] | None = None, rows: RowsFile | None = None
         ) -> EvalResult:
    """Build the env and the policy that ``run`` names and play it (`evaluate.evaluate_policy`), each episode's
    row going to ``rows`` as it ends (the kept ones of a resumed run not played again)."""
    from trace_gym.agents.policy import SamplingParams
    from trace_gym.agents.specs import policy_from_spec
    from trace_gym.env_specs import env_factory
    from trace_gym.training.rollout.evaluate import evaluate_policy

    make_env = env_factory(run.env, run.env_args)
    tasks = make_env.tasks()  # loads (and checks) the data before a model loads
    if not tasks:
        raise ConfigError(f"expected tasks in {run.env} {run.env_args or ''}, got none; fix: check its data or "
                          "--env-arg settings")
    chosen = tasks[:run.tasks] if run.tasks else tasks
    policy = policy_from_spec(run.policy, run.options, make_env)
    sampling = SamplingParams(temperature=run.temperature, max_new_tokens=run.max_new_tokens)
    return evaluate_policy(policy, make_env, chosen, run.samples, sampling, run.seed, run.keep_trees, run.workers,
                           run.max_context, run.branches, progress, kept=rows.kept if rows else (),
                           on_episode=rows.episode if rows else None, breaker=HELD_OUT.breaker,
                           on_tree=rows.tree if rows else None)


def run(command: str, args: argparse.Namespace, console: Console | None = None) -> int:
    """``trace-gym eval --policy`` or ``trace-gym rollout``: play, writing rows as episodes end, then `report`.
    Ctrl-C and a server gone (the breaker) keep the finished rows and say in one line how to go on."""
    from rich.console import Console

    console = console or Console()
    plan = policy_run(command, args)
    rows = open_rows(plan.out, command, plan.keep_trees, plan.settings(), plan.resume)
    start = time.perf_counter()
    with progress_bar(console, enabled=not plan.as_json, label=command) as progress:
        result = guarded(command, rows, lambda: play(plan, progress, rows))
    if result is None:
        return 130
    about = {"command": command, "env": plan.env, "env_args": plan.env_args, "policy": plan.policy,
             "samples": plan.samples, "branches": plan.branches, "temperature": plan.temperature,
             "max_new_tokens": plan.max_new_tokens, "seed": plan.seed}
    summary = report(result, about, time.perf_counter() - start, plan.out, console, plan.as_json,
                     streamed=rows is not None)
    failed = result.infra["server_error"]
    if result.episodes and failed == result.episodes:  # not the model's score: the server never answered
        raise ServerError(f"every one of the {result.episodes} episodes ended on a failed request (rows written "
                          f"with each error); the first: {summary['first_error']}")
    return 0


def open_rows(out: Path | None, command: str, keep_trees: bool, settings: dict[str, Any], resume: bool
              ) -> RowsFile | None:
    """The `RowsFile` an evaluation writes under ``out`` as episodes end (None without ``out``; module
    docstring: a .jsonl file gets the command's main output, a folder the rows and, when kept, the trees)."""
    from trace_gym.training.rollout.evaluate import RowsFile

    if out is None:
        if resume:
            raise ConfigError(f"expected --out with --resume (the earlier run's rows are there), got no --out; "
                              f"fix: trace-gym {command} ... --out DIR --resume")
        return None
    if out.suffix == ".jsonl":
        rows, trees = (None, out) if command == "rollout" else (out, None)
    else:
        rows, trees = out / "rows.jsonl", out / "trees.jsonl" if keep_trees else None
    return RowsFile(rows, settings, resume, trees)


def guarded(command: str, rows: RowsFile | None, play: Callable[[], EvalResult]) -> EvalResult | None:
    """``play()``, its rows finished in order when it ends; on Ctrl-C the finished rows stay and one line says
    how to resume (returns None: exit 130); the breaker's stop is a one-line `ServerError` saying the same."""
    from trace_gym.training.rollout.evaluate import EvalStopped

    try:
        result = play()
    except KeyboardInterrupt:
        if rows is not None:
            rows.close()
        print(f"trace-gym {command}: interrupted; {_kept(rows)}", file=sys.stderr)
        return None
    except EvalStopped as exc:
        if rows is not None:
            rows.close()
        raise ServerError(f"{exc}; {_kept(rows, 'when the server is back')}") from None
    if rows is not None:
        rows.finish(result)
    return result


def _kept(rows: RowsFile | None, when: str = "to finish the rest") -> str:
    """Where the finished episodes are and how to play the rest (one line's end)."""
    if rows is None:
        return "nothing kept (no --out); rerun with --out DIR to keep episodes as they finish"
    where = rows.path or rows.trees
    argv = sys.argv[1:]
    again = "trace-gym " + shlex.join([*argv, *([] if "--resume" in argv else ["--resume"])]) if argv else \
        "the same command with --resume"
    return f"{rows.finished} finished episodes kept in {where}; {when}, run {again}"


@contextmanager
def progress_bar(console: Console, enabled: bool, label: str) -> Iterator[Callable[[int, int], None] | None]:
    """Progress over episodes, fed by ``progress(done, total)`` (`trace_gym.progress.Progress`: a rich bar on a
    terminal, plain lines on stderr in a log or a pipe); None when not ``enabled``."""
    if not enabled:
        yield None
        return
    from trace_gym.progress import Progress

    with Progress(f"{label} episodes", unit="episode", console=console, transient=True) as bar:
        yield lambda done, total: bar.update(done=done, total=total)


def write_outputs(result: EvalResult, out: Path, command: str, summary: dict[str, Any], streamed: bool = False
                  ) -> dict[str, str]:
    """Write ``result`` under ``out`` (module docstring: a .jsonl file gets the command's main output, a folder
    all of them); returns the paths written, by kind. ``summary`` gains the list before it is saved. With
    ``streamed`` the rows and trees are already there (`RowsFile`): only the summary is written."""
    if streamed:
        rows, trees = ((None, out) if command == "rollout" else (out, None)) if out.suffix == ".jsonl" else \
            (out / "rows.jsonl", out / "trees.jsonl" if (out / "trees.jsonl").is_file() else None)
        files = {k: str(p) for k, p in (("rows", rows), ("trees", trees)) if p is not None}
        if out.suffix != ".jsonl":
            files["summary"] = str(out / "summary.json")
            (out / "summary.json").write_text(json.dumps({**summary, "files": files}, indent=2) + "\n")
        return files
    if out.suffix == ".jsonl":
        out.parent.mkdir(parents=True, exist_ok=True)
        if command == "rollout":
            _write_lines(out, (t.to_json() for t in result.trees))
            return {"trees": str(out)}
        result.write(out)
        return {"rows": str(out)}
    out.mkdir(parents=True, exist_ok=True)
    files = {"rows": str(out / "rows.jsonl"), "summary": str(out / "summary.json")}
    if result.trees:
        files["trees"] = str(out / "trees.jsonl")
    result.write(out / "rows.jsonl", out / "trees.jsonl" if result.trees else None)
    (out / "summary.json").write_text(json.dumps({**summary, "files": files}, indent=2) + "\n")
    return files


def _write_lines(path: Path, lines: Iterator[str]) -> None:
    with path.open("w") as f:
        for line in lines:
            f.write(line + "\n")


def summarise(result: EvalResult, about: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The summary of an evaluation: ``about`` (what ran) plus tasks, episodes, success with its 95% Wilson
    interval over tasks (None without tasks), tasks with mixed outcomes, mean turns, stop reasons, the episodes
    the infrastructure ended (``errors``: "server_error" and "infra_error", each counted in ``infra`` and never
    scored; the first such error), the episodes ``scored`` and seconds."""
    lo, hi = result.interval()
    turns = [n for t in result.tasks for n in t.turns]
    reasons = Counter(r for t in result.tasks for r in t.stop_reasons)
    first_error = next((e for t in result.tasks for e in t.errors if e), None)
    return {**about, "tasks": len(result.tasks), "episodes": result.episodes, "success": _num(result.success),
            "success_ci95": [_num(lo), _num(hi)], "mixed_tasks": sum(t.mixed for t in result.tasks),
            "mean_turns": sum(turns) / len(turns) if turns else 0.0, "stop_reasons": dict(reasons.most_common()),
            "scored": result.scored, "errors": result.errors, "infra": result.infra, "first_error": first_error,
            "seconds": round(seconds, 2)}


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


def report(result: EvalResult, about: dict[str, Any], seconds: float, out: Path | None, console: Console,
           as_json: bool, streamed: bool = False) -> dict[str, Any]:
    """Write the outputs (when ``out``; ``streamed`` as in `write_outputs`) and print the summary: as JSON, or as
    a table. Returns the summary."""
    summary = summarise(result, about, seconds)
    if out is not None:
        summary["files"] = write_outputs(result, out, about["command"], summary, streamed)
    if as_json:
        console.out(json.dumps(summary, indent=2), highlight=False)  # plain JSON, for jq, even on a terminal
    else:
        console.print(summary_table(summary))
    return summary


def success_text(summary: dict[str, Any]) -> str:
    """``0.850 (95% interval 0.780 to 0.920)``: the success and its interval as the table shows them."""
    success, (lo, hi) = summary["success"], summary["success_ci95"]
    if success is None or lo is None:
        return "n/a (no tasks)"
    return f"{success:.3f} (95% interval {lo:.3f} to {hi:.3f})"


def summary_table(summary: dict[str, Any]) -> Any:
    """The rich table of a summary (what ran, the success and its interval, where the files went)."""
    from rich import box
    from rich.table import Table

    table = Table(title=f"trace-gym {summary['command']}", box=box.SIMPLE_HEAD, show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("", overflow="fold")
    per_task = _count(summary["samples"], "sample")
    if summary["branches"]:
        per_task = f"({per_task} + {_count(summary['branches'], 'branch')})"
    env_args = " ".join(f"{k}={v}" for k, v in summary["env_args"].items())
    rows = [("env", f"{summary['env']} {env_args}".strip()), ("policy", summary["policy"]),
            ("episodes", f"{summary['episodes']} ({_count(summary['tasks'], 'task')} x {per_task})"),
            ("success", success_text(summary)),
            *([("sampled", f"temperature {summary['temperature']:g}, seed {summary['seed']}: the success is one "
                           "draw; another seed (or a training run's own evaluation) draws again, within the "
                           "interval")] if summary.get("temperature") else []),
            ("mixed tasks", f"{summary['mixed_tasks']} of {summary['tasks']} (both a success and a failure)"),
            ("mean turns", f"{summary['mean_turns']:.2f}"),
            ("stop reasons", ", ".join(f"{k} {v}" for k, v in summary["stop_reasons"].items()) or "-")]
    if summary.get("errors"):
        what = ", ".join(f"{k} {v}" for k, v in summary.get("infra", {}).items() if v)
        rows.append(("not scored", f"{summary['errors']} of {summary['episodes']} episodes ended by the "
                                   f"infrastructure ({what}), left out of the success; the first: "
                                   f"{summary['first_error']}"))
    rows.append(("seconds", f"{summary['seconds']:.1f}"))
    rows += [(kind, path) for kind, path in summary.get("files", {}).items()]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('ch') else 's'}"
