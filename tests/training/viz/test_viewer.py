"""The tree viewer: loading, the embedded data, and the page itself driven in headless Chromium over CDP.

Trees are real: TreeRolloutWrapper over trace/HotpotQA's MultiHopQAEnv driven by its noisy scripted expert, with
root and prefix allocations chosen by the real solvers from a fitted FeaturePredictor (``collect_trees``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.agents.policy import SamplingParams
from trace_gym.agents.scripted import ExpertPolicy
from trace_gym.errors import ConfigError
from trace_gym.training.allocation.allocators import make_allocator
from trace_gym.training.allocation.predictor import FeaturePredictor
from trace_gym.training.config import StepBudget
from trace_gym.training.rollout.collector import TreeCollector
from trace_gym.training.step import take_step
from trace_gym.training.viz.viewer import TreeRecord, load_trees, page_data, render_html, split_action, write_viewer
from trace_gym.tree import RolloutTree
from trace_gym.wrappers import TreeRolloutWrapper

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


# ---------------------------------------------------------------------------------------------- real trees
def _play(wrapper: TreeRolloutWrapper, expert: Any, obs_info: tuple[str, dict]) -> float:
    _, info = obs_info
    while True:
        _, reward, terminated, truncated, info = wrapper.step(expert.act(wrapper.base.task, info["messages"]))
        if terminated or truncated:
            return float(reward)


def collect_trees(n_prompts: int = 6, budget: int = 12, seed: int = 0) -> list[RolloutTree]:
    """One TRACE step on HotpotQA with the scripted expert, through the trainer's own step (`take_step`): root
    allocation over a pool, bare rollouts, prefix expansion (one continuation per root rollout), annotated
    for the viewer. A first uniform step warms the predictor up."""
    from trace_gym.environments.qa.env import MultiHopQAEnv

    env = MultiHopQAEnv(max_turns=5)
    pool = list(env.tasks[:n_prompts])
    policy = ExpertPolicy(lambda s: env.expert(noise=0.35, seed=s))
    collector = TreeCollector(policy, lambda: MultiHopQAEnv(max_turns=5), pool, SamplingParams(), workers=1)
    predictor, steps = FeaturePredictor(steps=30), StepBudget(roots=budget, multiplier=1)
    try:
        take_step(collector, make_allocator("grpo", group_size=4), predictor, pool, steps, seed=seed, step=1)
        trees = take_step(collector, make_allocator("trace", cap=4), predictor, pool, steps, seed=seed, step=2).trees
    finally:
        collector.close()
        env.close()
    return list(trees.values())


def expert_tree(noise: float, index: int, rollouts: int = 3) -> RolloutTree:
    """A tree of one prompt played by the expert at a fixed noise: at noise 1 it always searches distractors and
    answers wrong (every rollout fails), at noise 0 every rollout succeeds. The filters need both kinds whatever
    the collected step happened to produce."""
    from trace_gym.environments.qa.env import MultiHopQAEnv

    env = MultiHopQAEnv(max_turns=3)
    wrapper = TreeRolloutWrapper(env)
    expert = env.expert(noise=noise, seed=0)
    obs_info = wrapper.reset(seed=0, options={"index": index})
    for j in range(rollouts):
        _play(wrapper, expert, obs_info if j == 0 else wrapper.branch(0))
    tree = wrapper.tree
    wrapper.close()
    return tree


@pytest.fixture(scope="module")
def trees() -> list[RolloutTree]:
    out = collect_trees()
    return [*out[:4], expert_tree(noise=1.0, index=7), expert_tree(noise=0.0, index=8), *out[4:]]


@pytest.fixture(scope="module")
def trees_file(trees, tmp_path_factory) -> Path:
    """Half the lines wrapped as the trainer writes them ({"step", "tree"}), half bare to_dict()."""
    path = tmp_path_factory.mktemp("trees") / "trees.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for i, tree in enumerate(trees):
            obj = {"step": i % 2, "tree": tree.to_dict()} if i % 2 else tree.to_dict()
            fh.write(json.dumps(obj) + "\n")
    return path


# ---------------------------------------------------------------------------------------------- pure Python
def test_load_trees_reads_bare_and_wrapped_lines(trees, trees_file):
    records = load_trees([trees_file])
    assert [r.tree.to_dict() for r in records] == [t.to_dict() for t in trees]
    assert [r.step for r in records] == [None if i % 2 == 0 else 1 for i in range(len(trees))]


def test_load_trees_names_the_bad_line(tmp_path, trees):
    path = tmp_path / "bad.jsonl"
    path.write_text(trees[0].to_json() + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2"):
        load_trees([path])


def test_page_data_values_match_the_tree(trees):
    data = page_data([TreeRecord(t) for t in trees])
    for tree, td in zip(trees, data["trees"]):
        for node, nd in zip(tree.nodes, td["nodes"]):
            assert nd["value"] == pytest.approx(tree.value(node.id), nan_ok=True)
            assert (nd["wins"] > 0 and nd["losses"] > 0) == tree.is_mixed(node.id)
            assert nd["predicted"] == node.meta.get("predicted")


def test_split_action_separates_thought_calls_and_answer():
    action = 'I should look. <tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>'
    parts = split_action(action, ["search"])
    assert parts["thought"] == "I should look."
    assert json.loads(parts["calls"][0]) == {"name": "search", "arguments": {"query": "x"}}
    assert parts["answer"] is None
    tags = split_action("<think>hmm</think><search>Paris</search>", ["search"])
    assert tags == {"thought": "hmm", "calls": ["search: Paris"], "answer": None}
    assert split_action("so <answer>42</answer>")["answer"] == "42"


_DATA_BLOCK = re.compile(r'<script type="application/json" id="data">(.*?)</script>', re.DOTALL)


@settings(max_examples=40, deadline=None)
@given(obs=st.text(), action=st.text())
def test_any_text_round_trips_through_the_embedded_json(obs, action):
    tree = RolloutTree("t</script><!--", obs)
    tree.add(0, action, obs + "</script>", reward=1.0, terminated=True)
    page = render_html([TreeRecord(tree)])
    blocks = _DATA_BLOCK.findall(page)
    assert len(blocks) == 1  # no text closed the data block early
    data = json.loads(blocks[0])
    assert data["trees"][0]["task_id"] == "t</script><!--"
    assert data["trees"][0]["nodes"][1]["action"] == action
    assert data["trees"][0]["nodes"][1]["observation"] == obs + "</script>"


# ---------------------------------------------------------------------------------------------- the browser
class Chrome:
    """Headless Chromium with one page, driven through the DevTools protocol (websocket-client)."""

    def __init__(self, width: int = 1400, height: int = 860):
        import websocket

        self.profile = tempfile.mkdtemp(prefix="trace-gym-chromium-")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = json.load(resp)
        ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Network", "Runtime"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def eval(self, expression: str) -> Any:
        res = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    def open(self, url: str) -> None:
        self.events.clear()
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while not self.eval("document.readyState === 'complete' && document.body.dataset.ready === '1'"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"page did not finish loading: {url}")
            time.sleep(0.05)

    def click(self, selector: str) -> None:
        """A real mouse click at the centre of the element (scrolled into view first)."""
        box = self.eval(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            e.scrollIntoView({{block: 'center', inline: 'center'}}); const r = e.getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def screenshot(self, path: Path) -> None:
        import base64

        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def chrome() -> Iterator[Chrome]:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI; fix: run scripts/install_system_deps.sh in the set-up")
        pytest.skip("chromium not installed; run scripts/install_system_deps.sh")
    browser = Chrome()
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def page(chrome, trees_file, tmp_path_factory) -> str:
    out = write_viewer([trees_file], tmp_path_factory.mktemp("page") / "trees.html")
    chrome.open(out.as_uri())
    return out.as_uri()


def test_page_lists_every_tree(chrome, page, trees):
    items = chrome.eval("[...document.querySelectorAll('#list li')].map(li => li.title)")
    assert items == [t.task_id for t in trees]
    drawn = chrome.eval("document.querySelectorAll('#svg .node').length")
    assert drawn == len(trees[0].nodes)


def test_clicking_a_node_shows_its_turn_in_the_panel(chrome, page, trees):
    tree_index, tree = next((i, t) for i, t in enumerate(trees) if len(t.nodes) > 3)
    node = tree.nodes[2]
    chrome.click(f'#list li[data-index="{tree_index}"]')
    chrome.click(f'#svg .node[data-id="{node.id}"] .shape')
    panel = chrome.eval("document.getElementById('panel').innerText")
    assert f"node {node.id}" in panel
    assert node.observation.strip()[:200] in panel
    query = json.loads(re.search(r"<tool_call>(.*?)</tool_call>", node.action, re.DOTALL).group(1))["arguments"]
    assert query["query"] in panel
    v = tree.value(node.id)
    assert f"{v:.2f}" in panel


def test_allocation_decisions_are_marked(chrome, page, trees):
    tree_index, tree = next((i, t) for i, t in enumerate(trees)
                            if any(n.meta.get("alloc", {}).get("stage") == "prefix" for n in t.nodes))
    chrome.click(f'#list li[data-index="{tree_index}"]')
    allocated = [n for n in tree.nodes if n.meta.get("alloc", {}).get("continuations")]
    badges = chrome.eval("[...document.querySelectorAll('#svg .node')].filter(g => g.querySelector('.ring'))"
                         ".map(g => [Number(g.dataset.id), g.querySelector('.badge').textContent])")
    assert sorted(badges) == sorted([n.id, f"+{n.meta['alloc']['continuations']}"] for n in allocated)


def test_filters_and_search_select_matching_trees(chrome, page, trees):
    def shown() -> list[str]:
        return chrome.eval("[...document.querySelectorAll('#list li[data-index]')].map(li => li.title)")

    mixed = [t.task_id for t in trees if t.is_mixed()]
    failed = [t.task_id for t in trees if t.leaves() and all(n.reward < 0.5 for n in t.leaves())]
    assert mixed and failed and len(mixed) + len(failed) < len(trees)  # each filter has something to drop
    chrome.eval("document.getElementById('f-mixed').click()")
    assert shown() == mixed
    chrome.eval("document.getElementById('f-mixed').click(); document.getElementById('f-failed').click()")
    assert shown() == failed
    chrome.eval("document.getElementById('f-failed').click()")
    target = trees[3].task_id
    chrome.eval(f"const s = document.getElementById('search'); s.value = {json.dumps(target[-6:])};"
                "s.dispatchEvent(new Event('input'))")
    assert shown() == [t.task_id for t in trees if target[-6:].lower() in t.task_id.lower()]
    chrome.eval("const s2 = document.getElementById('search'); s2.value = ''; s2.dispatchEvent(new Event('input'))")


def test_no_request_leaves_the_page(chrome, trees, trees_file, tmp_path):
    out = write_viewer([trees_file], tmp_path / "trees.html")
    chrome.open(out.as_uri())
    chrome.click(f'#list li[data-index="{next(i for i, t in enumerate(trees) if len(t.nodes) > 1)}"]')
    chrome.click('#svg .node[data-id="1"] .shape')
    chrome.eval("1")  # drain events queued by the click
    urls = [e["params"]["request"]["url"] for e in chrome.events if e["method"] == "Network.requestWillBeSent"]
    assert urls and urls[0] == out.as_uri()
    assert all(u.startswith(("file:", "data:")) for u in urls), urls
    errors = [e for e in chrome.events if e["method"] == "Runtime.exceptionThrown"]
    assert not errors


def test_cli_view_writes_the_page(trees_file, tmp_path, capsys):
    from trace_gym.training.cli.main import main as cli_main

    out = tmp_path / "page.html"
    assert cli_main(["view", str(trees_file), "--out", str(out), "--title", "my <trees>"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert "<title>my &lt;trees&gt;</title>" in out.read_text(encoding="utf-8")
    assert cli_main(["view", str(tmp_path / "missing.jsonl")]) == 2  # a user error: one line, exit status 2


def test_a_run_folder_stands_for_its_tree_files(trees_file):
    # The folder also gets a metrics-like JSONL that is not a tree file; it must be left out, not fail.
    (trees_file.parent / "metrics.jsonl").write_text('{"step": 1, "rollout/success": 0.5}\n')
    assert [r.tree.task_id for r in load_trees([trees_file.parent])] == \
        [r.tree.task_id for r in load_trees([trees_file])]
