"""lm view: the pages of tiny runs (RoPE, ALiBi, FoX, a flip-flop task run) and of a comparison,
opened in headless Chromium (Debian's ``chromium`` driven by Playwright); the served page; the
bad input. The browser tests skip, in one line, where Chromium is missing."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _support import assert_one_line, expect_error, tiny_config

import lm
from lm.cli import main
from lm.config.errors import LMError
from lm.config.load import load_config
from lm.explorer.page import render
from lm.runs.load import load_run

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The with statement"
SHAPE = {"context_length": 16, "n_layer": 2, "n_head": 2, "d_model": 16}
STEPS = {"max_steps": 8, "eval_every": 4, "eval_steps": 1, "checkpoint_every": 8}


def _train(root: Path, name: str, **sections) -> Path:
    model = {**SHAPE, **sections.pop("model", {})}
    data = {"cache_dir": str(root / "cache"), **sections.pop("data", {})}
    config = tiny_config(model=model, data=data, train={**STEPS, **sections.pop("train", {})})
    lm.train(config, root / name, quiet=True)
    return root / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny runs, trained once for the module, and a comparison of three of them."""
    root = tmp_path_factory.mktemp("view")
    made = {
        position: _train(root, position, model={"position": position})
        for position in ("rope", "alibi", "fox", "learned", "pope")
    }
    made["flipflop"] = _train(
        root,
        "flipflop",
        model={"position": "rope"},
        data={
            "source": "builtin:flipflop",
            "mode": "padded",
            "task_lengths": "2-6",
            "task_eval_lengths": "6-7",
            "task_examples": 200,
            "task_eval_examples": 2,
        },
    )
    # Four checkpoints, steps 2, 4, 6 and 8, for the scrubber.
    made["scrub"] = _train(root, "scrub", train={"checkpoint_every": 2, "keep_checkpoints": 8})
    compared = [str(made[p]) for p in ("rope", "alibi", "fox")]
    argv = ["compare", *compared, "--out", str(root / "compare"), "--quiet", "--eval-batches", "1"]
    assert main([*argv, "--max-new-tokens", "4"]) == 0
    made["compare"] = root / "compare"
    return SimpleNamespace(root=root, **made)


def _page(runs, name: str, *extra: str) -> Path:
    out = runs.root / f"{name}.html"
    if not out.exists():
        prompt = (
            [] if name == "compare" else ["--prompt", "w1i0r1w0r" if name == "flipflop" else PROMPT]
        )
        assert main(["view", str(getattr(runs, name)), *prompt, "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(
            "no /usr/bin/chromium: install it (apt-get install chromium) for the browser tests"
        )
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Opened(SimpleNamespace):
    """A page open in the browser, with every console error, page error and request it made."""


def _open(browser, url: str) -> Opened:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    seen = Opened(page=page, errors=[], requests=[])
    page.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen.errors.append(str(e)))
    page.on("request", lambda r: seen.requests.append(r.url))
    page.goto(url)
    page.wait_for_selector("body[data-version]")
    return seen


def _maps(run_dir: Path, text: str, checkpoint: str | None = None) -> tuple[np.ndarray, ...]:
    """lm's own scores ``S + B + M`` and attention weights of ``text`` (at ``checkpoint``,
    default the newest), ``[layers, heads, T, T]`` each."""
    run = load_run(run_dir, checkpoint)
    ids = torch.tensor([run.tokenizer.encode(text)])
    both = run.model.attention_weights(ids)
    return tuple(np.stack([pair[i][0].double().numpy() for pair in both]) for i in (0, 1))


def _weights(run_dir: Path, text: str, checkpoint: str | None = None) -> np.ndarray:
    """lm's own attention weights of ``text``, ``[layers, heads, T, T]``."""
    return _maps(run_dir, text, checkpoint)[1]


def _shown_weights(page, run: int, layer: int, head: int, query: int) -> list[str | None]:
    """Choose the layer and head, hover token ``query`` of run ``run``: each key's weight as
    the page shows it (None for a key after the query)."""
    page.select_option("#layer", str(layer))
    page.select_option("#head", str(head))
    page.hover(f'.run[data-run="{run}"] .tokens .tok[data-i="{query}"]')
    return page.eval_on_selector_all(
        f'.run[data-run="{run}"] .tokens .tok', "spans => spans.map(s => s.dataset.w ?? null)"
    )


def _check_hover(page, run: int, weights: np.ndarray) -> None:
    L, H, T, _ = weights.shape
    for layer, head, query in ((0, 0, T - 1), (L - 1, H - 1, T // 2), (L - 1, 0, 1)):
        shown = _shown_weights(page, run, layer, head, query)
        assert shown[query + 1 :] == [None] * (T - query - 1)
        want = weights[layer, head, query, : query + 1]
        got = np.array([float(w) for w in shown[: query + 1]])
        np.testing.assert_allclose(got, want, atol=0.5e-4 + 1e-9, rtol=0)
        assert all(re.fullmatch(r"\d\.\d{4}", w) for w in shown[: query + 1])


def _plotted(page, selector: str) -> list[tuple[np.ndarray, np.ndarray, dict]]:
    """Every line of the charts ``selector`` names, turned back from the SVG's coordinates to
    values through the axes the chart says it drew: ``(x, y, the path's data attributes)``."""
    lines = page.eval_on_selector_all(
        selector,
        """svgs => svgs.flatMap(svg => [...svg.querySelectorAll('path.series')].map(p =>
            ({d: p.getAttribute('d'), data: {...p.dataset}, axes: {...svg.dataset}})))""",
    )
    out = []
    for line in lines:
        a = {k: float(v) for k, v in line["axes"].items()}
        points = np.array(re.findall(r"[ML](-?[\d.]+),(-?[\d.]+)", line["d"]), dtype=float)
        x = a["x0"] + (points[:, 0] - a["px0"]) / (a["px1"] - a["px0"]) * (a["x1"] - a["x0"])
        y = a["y0"] + (points[:, 1] - a["py0"]) / (a["py1"] - a["py0"]) * (a["y1"] - a["y0"])
        tolerance = (a["y1"] - a["y0"]) / abs(a["py1"] - a["py0"]) * 0.01  # 2-decimal pixels
        out.append((np.round(x), y, {**line["data"], "tolerance": tolerance}))
    return out


def _at(line, distances) -> np.ndarray:
    x, y, _ = line
    return np.array([y[np.flatnonzero(x == n)[0]] for n in distances])


@pytest.mark.parametrize("name", ["rope", "alibi", "fox", "flipflop", "compare"])
def test_a_page_opens_offline_with_a_map_for_every_layer_and_head_and_lms_weights(
    runs, browser, name
):
    opened = _open(browser, _page(runs, name).as_uri())
    page = opened.page
    sections = page.query_selector_all(".run")
    assert len(sections) == (3 if name == "compare" else 1)
    for r in range(len(sections)):
        heads = page.eval_on_selector_all(
            f'.run[data-run="{r}"] canvas.heatmap',
            "cs => cs.map(c => [c.dataset.layer, c.dataset.head, c.width])",
        )
        assert sorted((int(l), int(h)) for l, h, _ in heads) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    prompt = "w1i0r1w0r" if name == "flipflop" else PROMPT
    if name == "compare":
        prompt = json.loads((runs.compare / "report.json").read_text())["prompt"]
        for r, scheme in enumerate(("rope", "alibi", "fox")):
            _check_hover(page, r, _weights(getattr(runs, scheme), prompt))
    else:
        _check_hover(page, 0, _weights(getattr(runs, name), prompt))
    assert opened.errors == []
    assert [u for u in opened.requests if u != _page(runs, name).as_uri()] == []
    page.close()


def test_a_prompt_that_opens_an_html_comment_and_a_script_still_draws(runs, browser):
    text = "<!--<script>"
    out = runs.root / "comment.html"
    assert main(["view", str(runs.rope), "--prompt", text, "--out", str(out)]) == 0
    opened = _open(browser, out.as_uri())
    assert opened.page.eval_on_selector_all("canvas.heatmap", "cs => cs.length") == 4
    shown = opened.page.eval_on_selector_all(".tokens .tok", "s => s.map(t => t.textContent)")
    assert "".join(shown) == text
    assert opened.errors == []
    opened.page.close()


def test_the_data_holds_no_character_that_html_reads_inside_a_script():
    said = "<!--<script></script>&amp;\u2028"  # e.g. what a 4x continuation said
    data = {"kind": "run", "title": "t", "curves": [], "runs": [{"prompt": "a", "tokens": ["a"]}]}
    data["runs"][0]["long"] = {"said": said}
    page = render(data)
    embedded = re.search(r'id="lm-data">(.*?)</script>', page, re.S).group(1)
    assert not set("<>&") & set(embedded)
    assert json.loads(embedded)["runs"][0]["long"]["said"] == said


def _rope_formula(n: np.ndarray, d_k: int) -> np.ndarray:
    theta = 10000.0 ** (-np.arange(0, d_k, 2) / d_k)
    return (2 * np.cos(n[:, None] * theta)).sum(-1) / math.sqrt(d_k)


def test_the_rope_distance_plot_is_the_rotated_score_of_a_fixed_pair(runs, browser):
    opened = _open(browser, _page(runs, "rope").as_uri())
    (line,) = _plotted(opened.page, ".signal svg")
    n = np.array([1, 7, 50])
    d_k = SHAPE["d_model"] // SHAPE["n_head"]
    np.testing.assert_allclose(_at(line, n), _rope_formula(n, d_k), atol=line[2]["tolerance"])
    assert line[0].max() == 4 * SHAPE["context_length"] - 1  # out to 4x the context


def test_the_alibi_distance_plot_is_minus_the_slope_times_the_distance(runs, browser):
    opened = _open(browser, _page(runs, "alibi").as_uri())
    lines = _plotted(opened.page, ".signal svg")
    for head in range(SHAPE["n_head"]):
        opened.page.select_option("#head", str(head))
        line = next(x for x in _plotted(opened.page, ".signal svg") if x[2]["head"] == str(head))
        slope = 2.0 ** (-8.0 * (head + 1) / SHAPE["n_head"])
        n = np.array([0, 9, 40])
        np.testing.assert_allclose(_at(line, n), -slope * n, atol=line[2]["tolerance"])
    assert {x[2]["layer"] for x in lines} == {"0"}  # the chosen layer's heads are drawn


def test_the_fox_distance_plot_sums_the_log_forget_gates_between_key_and_query(runs, browser):
    opened = _open(browser, _page(runs, "fox").as_uri())
    run = load_run(runs.fox)
    gates = []
    gate = run.model.blocks[0].attn.position.gate  # f_t = sigma(w . x_t + b), per head
    hook = gate.register_forward_hook(lambda m, i, out: gates.append(F.logsigmoid(out[0])))
    with torch.no_grad():
        run.model(torch.tensor([run.tokenizer.encode(PROMPT)]))
    hook.remove()
    c = gates[0].double().cumsum(0).numpy()  # (T, H): sum of log f up to t
    T = c.shape[0]
    for head in range(SHAPE["n_head"]):
        opened.page.select_option("#head", str(head))
        line = next(x for x in _plotted(opened.page, ".signal svg") if x[2]["head"] == str(head))
        n = np.array([0, 3, T - 1])
        want = c[T - 1, head] - c[T - 1 - n, head]  # D = sum_{t = j+1 .. l} log f_t, l = T - 1
        np.testing.assert_allclose(_at(line, n), want, atol=line[2]["tolerance"])


def test_the_pope_distance_plot_turns_each_heads_learned_offsets(runs, browser):
    opened = _open(browser, _page(runs, "pope").as_uri())
    run = load_run(runs.pope)
    d_k = SHAPE["d_model"] // SHAPE["n_head"]
    theta = 10000.0 ** (-np.arange(d_k) / d_k)
    offsets = run.model.blocks[0].attn.position.offset.detach().double().numpy()  # (H, d_k)
    assert np.abs(offsets).max() > 1e-4  # trained away from 0, so each head's line differs
    mu = math.log1p(math.e)  # softplus(1): the content's magnitude of q = k = 1
    n = np.array([1, 9, 50])
    for head in range(SHAPE["n_head"]):
        opened.page.select_option("#head", str(head))
        lines = _plotted(opened.page, ".signal svg")
        line = next(x for x in lines if x[2]["layer"] == "0" and x[2]["head"] == str(head))
        # sum_c softplus(1)^2 cos((s - t) theta_c + delta_c) / sqrt(d_k), the key at s = 0
        want = mu**2 * np.cos(offsets[head] - n[:, None] * theta).sum(-1) / math.sqrt(d_k)
        np.testing.assert_allclose(_at(line, n), want, atol=line[2]["tolerance"])
    assert opened.errors == []


def _untrained(**model):
    from lm.model.transformer import TransformerLM

    torch.manual_seed(3)
    config = tiny_config(model={**SHAPE, "vocab_size": 11, **model}).model
    return TransformerLM(config).eval()


def test_the_fope_and_hope_distance_charts_follow_their_formulas():
    from lm.explorer.signal import signal_charts, turned_scores

    fope = _untrained(position="fope", n_kv_head=1)  # a series per key head, shared
    d_k, n = SHAPE["d_model"] // SHAPE["n_head"], np.array([0, 5, 40])
    omega = fope.blocks[1].attn.position.omega.numpy()
    a = fope.blocks[1].attn.position.coefficients[0].double().numpy()  # (pairs m, freqs w)
    f = (a[None] * np.exp(1j * n[:, None, None] * omega[None, None])).sum(-1)  # f_m(n)
    # q = k = 1: each pair (1 + i) f_m(n) against (1 + i) f_m(0); a pair's dot is Re(z conj w)
    want = (2 * (f * np.conj(f[:1])).real).sum(-1) / math.sqrt(d_k)
    got = turned_scores(fope, 1, 64)
    np.testing.assert_allclose(got[:, n], np.stack([want, want]), rtol=1e-5, atol=1e-6)
    # HoPE: RoPE's score with the pairs that turn less than once over the context left unturned
    hope = _untrained(position="hope")
    kept = int(hope.blocks[0].attn.position.rope.kept)
    theta = 10000.0 ** (-np.arange(0, d_k, 2) / d_k)
    theta[kept:] = 0.0
    want = (2 * np.cos(n[:, None] * theta)).sum(-1) / math.sqrt(d_k)
    np.testing.assert_allclose(turned_scores(hope, 0, 64)[:, n], np.stack([want, want]), atol=1e-5)
    (chart,) = signal_charts(hope, [1, 2, 3], list(range(64)), np.zeros((2, 2, 3, 3)))
    assert [s["label"] for s in chart["series"]] == ["hope"]  # one line: every layer and head
    (chart,) = signal_charts(fope, [1, 2, 3], list(range(64)), np.zeros((2, 2, 3, 3)))
    # one key head: its series is shared by both query heads, drawn once for each layer
    assert [(s["layer"], s["head"]) for s in chart["series"]] == [(0, None), (1, None)]


def test_a_task_page_lists_each_example_its_answer_and_the_distance_since_the_write(runs, browser):
    opened = _open(browser, _page(runs, "flipflop").as_uri())
    rows = opened.page.eval_on_selector_all(
        "table.task tr", "trs => trs.slice(1).map(t => [...t.cells].map(c => c.textContent))"
    )
    assert len(rows) == 3 * 2 * 2  # three splits, two lengths, two examples each
    for split, length, prompt, answer, said, mark, distance in rows:
        assert (
            split in ("in-distribution", "sparse", "dense") and len(prompt) == 2 * int(length) - 1
        )
        assert mark == ("✓" if said == answer else "✗")
        last_write = prompt.rindex("w")
        assert answer == prompt[last_write + 1]
        assert int(distance) == len(prompt[last_write:-1]) // 2


def test_a_comparison_page_draws_the_reports_curves_with_values_on_hover(runs, browser):
    opened = _open(browser, _page(runs, "compare").as_uri())
    report = json.loads((runs.compare / "report.json").read_text())
    titles = opened.page.eval_on_selector_all(".curve h3", "hs => hs.map(h => h.textContent)")
    assert titles == ["validation loss against step", "validation loss against evaluation length"]
    by_label = {r["label"]: r for r in report["runs"]}
    length_chart = _plotted(opened.page, ".curve:nth-child(2) svg")
    assert len(length_chart) == 3
    for x, y, data in length_chart:
        rows = [r for r in by_label[data["label"]]["extrapolation"] if r["loss"] is not None]
        assert list(x) == [r["context_length"] for r in rows]
        np.testing.assert_allclose(y, [r["loss"] for r in rows], atol=data["tolerance"])
    svg = opened.page.query_selector(".curve:nth-child(2) svg")
    box = svg.bounding_box()
    svg.hover(position={"x": box["width"] - 14, "y": box["height"] / 2})  # the longest length
    tip = opened.page.text_content("#tip")
    last = [r["loss"] for r in by_label[length_chart[0][2]["label"]]["extrapolation"]][-1]
    assert f"{last:.4f}" in tip


def test_a_comparisons_curve_of_one_point_per_run_is_left_to_the_reports_table(tmp_path):
    from lm.explorer.gather import _curves

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1500, "val_loss": 0.3}) + "\n")
    row = {"extrapolation": [{"context_length": 64, "loss": 0.3}],
           "accuracy": [{"split": "sparse", "length": 32, "accuracy": 0.5}]}  # fmt: skip
    assert _curves([("a", run, row), ("b", run, row)]) == []  # evaluated once, at one length
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3000, "val_loss": 0.2}) + "\n")
    (chart,) = _curves([("a", run, row)])
    assert chart["title"] == "validation loss against step"
    assert chart["series"][0]["x"] == [1500, 3000]


def test_the_python_api_gives_the_same_page_inline(runs):
    page = lm.view(lm.load(runs.rope, device="cpu"), PROMPT)
    data = json.loads(re.search(r'id="lm-data">(.*?)</script>', page.html, re.S).group(1))
    assert data["runs"][0]["tokens"] == list(PROMPT)
    assert page._repr_html_().startswith("<iframe srcdoc=")
    assert "<script" not in page._repr_html_()  # escaped into the frame's own document
    with pytest.raises(LMError):
        lm.view(lm.load(runs.rope, device="cpu"), "")


def _files(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.rglob("*")}


def _serve(run_dir: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """``lm view RUN --serve`` in a process of its own, and the address it printed."""
    argv = ["view", str(run_dir), "--prompt", "ab", "--serve", "--port", "0", "--device", "cpu"]
    server = subprocess.Popen(
        [sys.executable, "-m", "lm", *argv, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        # Ctrl-C as a terminal gives it, whatever an earlier test left this worker ignoring (an
        # ignored SIGINT is inherited, and Python then raises no KeyboardInterrupt).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        return server, _first_line(server)
    except BaseException:
        server.kill()
        server.communicate()
        raise


def _stopped(server: subprocess.Popen) -> str:
    """Ctrl-C: the server says it stopped, exit status 0; what it said on standard error."""
    server.send_signal(signal.SIGINT)
    _, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    assert err.strip().endswith("lm: stopped") and "terminate" not in err, err
    return err


def test_serve_binds_loopback_recomputes_typed_text_writes_nothing_and_stops(runs, browser):
    before = _files(runs.rope)
    server, url = _serve(runs.rope)
    try:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url), url
        opened = _open(browser, url)
        page = opened.page
        page.fill("#text", PROMPT)  # an input event per fill: the page asks for the new maps
        page.wait_for_selector('body[data-version="1"]')
        shown = page.eval_on_selector_all(".tokens .tok", "s => s.length")
        assert shown == len(PROMPT)
        _check_hover(page, 0, _weights(runs.rope, PROMPT))
        page.fill("#text", "é")
        page.wait_for_selector("#status.bad")
        assert "'é'" in page.text_content("#status")
        page.fill("#text", "a" * 70_000)  # far past an address's 64 KiB (HTTP 414 by GET)
        page.wait_for_selector("#status.bad:has-text('70000 tokens')")
        assert opened.errors == []
        assert all(u.startswith(url) for u in opened.requests)
        page.route("**/data", lambda r: r.fulfill(status=502, body="<h1>Bad Gateway</h1>\n"))
        page.fill("#text", "ab")  # an answer that is not JSON: said, never "computing…" for good
        page.wait_for_selector("#status.bad:has-text('502')")
        assert page.text_content("#status") == "502 Bad Gateway: <h1>Bad Gateway</h1>"
    finally:
        _stopped(server)
    assert _files(runs.rope) == before


def _request(url: str, host: str | None, method: str = "GET", body: bytes = b""):
    """A request to ``url`` with ``host`` as its Host header: (status, the JSON answer)."""
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    try:
        target = where.path + (f"?{where.query}" if where.query else "")
        connection.putrequest(method, target, skip_host=True)
        if host is not None:
            connection.putheader("Host", host)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        answer = connection.getresponse()
        text = answer.read()
        return answer.status, json.loads(text) if "json" in answer.getheader(
            "Content-Type"
        ) else text
    finally:
        connection.close()


def test_serve_answers_only_requests_named_for_its_loopback_address(runs):
    server, url = _serve(runs.rope)
    try:
        port = urlsplit(url).port
        data = url + "data?prompt=ab"
        for good in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}"):
            status, answer = _request(data, good)
            assert status == 200 and answer["runs"][0]["tokens"] == ["a", "b"], good
        evil = ("evil.example", f"evil.example:{port}", "127.0.0.1", f"127.0.0.1:{port + 1}", None)
        for bad in (*evil, f"localhost:{port}.evil.example"):
            status, answer = _request(data, bad)
            assert status == 403 and "runs" not in answer, bad
            assert repr((bad or "").lower()) in answer["error"] and "\n" not in answer["error"]
        status, answer = _request(url, "evil.example")
        assert status == 403  # the page itself too
        # Every error is one line of JSON, the standard library's own included.
        status, answer = _request(url + "data?prompt=" + "a" * 70_000, f"localhost:{port}")
        assert status == 414 and answer == {"error": "Request-URI Too Long"}
        status, answer = _request(url + "data", f"localhost:{port}", "POST", b"a" * 70_000)
        assert status == 200 and "70000 tokens" in answer["error"]
        status, answer = _request(url + "nowhere", f"localhost:{port}")
        assert status == 404 and "/nowhere" in answer["error"]
        status, answer = _request(url + "data", f"localhost:{port}", "POST", b"\xff")
        assert status == 400 and "not UTF-8" in answer["error"]
    finally:
        _stopped(server)


def test_ctrl_c_with_requests_in_flight_stops_cleanly(runs):
    """Ctrl-C while request threads are inside the model: it waits for the one computing, lets
    no other in, and exits 0 (an interpreter that ends with a thread inside torch aborts)."""
    address = "data?prompt=" + urllib.parse.quote(PROMPT * 3)
    for _ in range(2):
        server, url = _serve(runs.rope)
        for _ in range(20):
            threading.Thread(target=_ask, args=(url + address,), daemon=True).start()
        time.sleep(0.3)
        _stopped(server)


def test_a_second_ctrl_c_while_a_request_is_inside_the_model_leaves_at_once_without_abort(runs):
    address = "data?prompt=" + urllib.parse.quote(PROMPT * 3)
    server, url = _serve(runs.rope)
    for _ in range(20):
        threading.Thread(target=_ask, args=(url + address,), daemon=True).start()
    time.sleep(0.3)
    server.send_signal(signal.SIGINT)
    time.sleep(0.02)
    server.send_signal(signal.SIGINT)
    _, err = server.communicate(timeout=60)
    # The request had ended (0), or the second Ctrl-C came during the wait or after it (130, or
    # -2 where it lands as the interpreter exits): never SIGABRT (-6) or a traceback.
    assert server.returncode in (0, 130, -signal.SIGINT), err
    assert err.strip().splitlines()[-1].startswith("lm: ") and "Traceback" not in err, err


def _ask(url: str) -> None:
    with contextlib.suppress(OSError, http.client.HTTPException):  # abandoned by the server
        urllib.request.urlopen(url, timeout=60).read()


@pytest.fixture
def ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError as e:
        pytest.skip(f"this machine has no IPv6 loopback (::1: {e.strerror})")


def test_serve_on_the_ipv6_loopback(runs, ipv6_loopback):
    server, url = _serve(runs.rope, "--host", "::1")
    try:
        assert re.fullmatch(r"http://\[::1\]:\d+/", url), url
        port = urlsplit(url).port
        status, answer = _request(url + "data?prompt=ab", f"[::1]:{port}")
        assert status == 200 and answer["runs"][0]["tokens"] == ["a", "b"]
        assert _request(url + "data?prompt=ab", f"[::2]:{port}")[0] == 403
    finally:
        _stopped(server)


def _first_line(process: subprocess.Popen, timeout: float = 120.0) -> str:
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert line and line[0], process.stderr.read() if process.poll() is not None else "no address"
    return line[0].strip()


def test_serve_on_a_port_in_use_is_one_line_exit_2(runs, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["view", str(runs.rope), "--prompt", "ab", "--serve", "--port", str(port)]
        expect_error(capsys, argv, f"--port {port}: already in use")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["{root}/nowhere", "--prompt", "ab"], ["no such run or comparison"]),
        (["{root}", "--prompt", "ab"], ["neither a run", "nor a comparison"]),
        (["{rope}", "--prompt", ""], ["--prompt: empty"]),
        (["{rope}", "--prompt", "aé✓b"], ["'é', '✓'", "not in the run's vocabulary"]),
        (["{learned}", "--prompt", "x" * 17], ["17 tokens", "learned position table has 16"]),
        (["{rope}"], ["--prompt"]),
        (["{rope}", "--prompt", "ab", "--out", "{root}"], ["is a folder"]),
        (["{rope}", "--prompt", "ab", "--out", "{rope}/config.yaml/x.html"], ["a file"]),
        (["{rope}", "--prompt", "ab", "--out", "/proc/lm-view.html"], ["cannot be written"]),
        (["{rope}", "--prompt", "ab", "--serve", "--out", "x.html"], ["--serve writes nothing"]),
        (["{compare}", "--prompt", "ab", "--serve"], ["--serve: serves one run"]),
        (["{compare}", "--serve"], ["--serve: serves one run"]),  # not first asking a prompt
        (["{rope}", "--prompt", "ab", "--serve", "--host", "0.0.0.0"], ["not a loopback"]),
        (
            ["{scrub}", "--prompt", "ab", "--steps", "4,3"],
            ["--steps: no checkpoint at step 3", "checkpoints at steps 2, 4, 6, 8"],
        ),
        (["{rope}", "--prompt", "ab", "--steps", "2,x"], ["--steps", "not steps such as"]),
        (["{compare}", "--steps", "8"], ["--steps: a run's page scrubs its checkpoints"]),
        (["{rope}", "--prompt", "ab", "--serve", "--steps", "8"], ["--steps: --serve shows"]),
        (["{rope}", "--prompt", "ab", "--serve", "--host", "8.8.8.8"], ["not a loopback"]),
    ],
)
def test_bad_input_is_one_line_exit_2(runs, capsys, argv, words):
    where = {k: str(v) for k, v in vars(runs).items()}
    expect_error(capsys, ["view", *(a.format(**where) for a in argv)], *words)


def _bytes(run_dir: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
@pytest.mark.parametrize("name", ["config.yaml", "checkpoints/step_00000008/model.safetensors"])
def test_a_runs_own_file_is_never_replaced_by_a_page(runs, capsys, name, overwrite):
    before = _bytes(runs.rope)
    out = runs.rope / name
    argv = ["view", str(runs.rope), "--prompt", "ab", "--out", str(out), *overwrite]
    expect_error(capsys, argv, f"--out {out}: a file of the run {runs.rope.resolve()}")
    assert _bytes(runs.rope) == before
    assert lm.generate(lm.load(runs.rope, device="cpu"), "ab", max_new_tokens=2)  # still loads


def test_a_file_lm_view_did_not_write_is_replaced_only_with_overwrite(runs, capsys, tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("my notes\n")
    argv = ["view", str(runs.rope), "--prompt", "ab", "--out", str(notes)]
    expect_error(capsys, argv, f"--out {notes}: exists and is not a page", "--overwrite")
    assert notes.read_text() == "my notes\n"
    assert main([*argv, "--overwrite"]) == 0
    assert "lm view" in notes.read_text()
    assert main(argv) == 0  # a page lm view wrote: replaced without being asked
    notes.write_text("my notes\n")
    with pytest.raises(LMError) as refused:
        lm.view(runs.rope, "ab").save(notes)  # the Python API: the same rule
    assert_one_line(refused, "exists and is not a page lm view wrote")
    lm.view(runs.rope, "ab").save(notes, overwrite=True)
    assert "lm view" in notes.read_text()


def test_rerunning_the_same_view_replaces_its_own_page(runs, capsys):
    argv = ["view", str(runs.alibi), "--prompt", "ab"]
    assert main(argv) == 0
    first = (runs.alibi / "view.html").read_text()
    capsys.readouterr()
    assert main([*argv[:-1], "abc"]) == 0
    assert capsys.readouterr().out.strip() == str(runs.alibi / "view.html")
    second = (runs.alibi / "view.html").read_text()
    assert second != first and '"prompt":"abc"' in second


def test_the_default_runs_page_for_a_128_character_prompt_is_at_most_5_mb(runs):
    config = load_config(
        ROOT / "configs" / "default.yaml",
        [
            "train.max_steps=1",
            "train.checkpoint_every=1",
            "train.eval_every=0",
            "train.dtype=fp32",
            "model.kernel=math",
            f"data.cache_dir={runs.root / 'cache'}",
        ],
    )
    run_dir = runs.root / "default"
    lm.train(config, run_dir, quiet=True)
    text = ("The with statement is used to wrap the execution of a block " * 3)[:128]
    page = lm.view(run_dir, text, device="cpu")
    assert len(page.html.encode()) <= 5_000_000
    with pytest.raises(LMError) as refused:
        lm.view(runs.root / "nowhere", "ab")
    assert_one_line(refused, "no such run or comparison")


def test_the_pages_head_grid_is_what_lm_heads_reports(runs):
    # one definition of the scores (lm.evaluate_heads, tested on planted patterns in
    # tests/test_heads.py): the page and lm heads give the same numbers for the same checkpoint
    from lm.api import heads
    from lm.explorer import maps

    run = load_run(runs.rope)
    grid = maps.head_grid(run.model, run.tokenizer, run.config.train.seed)
    reported = heads(runs.rope)
    assert grid == {name: reported["scores"][name] for name in grid}
    assert set(grid) == {"previous_token", "induction", "duplicate_token", "first_token"}


def test_the_default_choice_of_checkpoints_is_at_most_8_evenly_with_the_first_and_last(tmp_path):
    from lm.explorer.gather import MAX_STEPS, chosen_checkpoints

    for step in range(10, 130, 10):  # 12 checkpoints
        folder = tmp_path / "checkpoints" / f"step_{step:08d}"
        folder.mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({"step": step}))
        (folder / "model.safetensors").write_bytes(b"")
    chosen = [int(p.name[5:]) for p in chosen_checkpoints(tmp_path, None)]
    assert chosen == [10, 30, 40, 60, 70, 90, 100, 120] and len(chosen) == MAX_STEPS
    assert [int(p.name[5:]) for p in chosen_checkpoints(tmp_path, [120, 20, 20])] == [20, 120]


def _pixels(page, selector: str) -> str:
    return page.eval_on_selector(selector, "c => c.toDataURL()")


def _scrub_to(page, index: int) -> None:
    page.eval_on_selector(
        "#step", "(s, i) => { s.value = i; s.dispatchEvent(new Event('input')); }", index
    )


def test_the_scrubber_moves_maps_scores_and_head_grid_through_the_checkpoints(runs, browser):
    opened = _open(browser, _page(runs, "scrub").as_uri())
    page = opened.page
    assert page.get_attribute("#step", "max") == "3"  # steps 2, 4, 6, 8
    assert page.text_content("#steplabel") == "step 8"
    _check_hover(page, 0, _weights(runs.scrub, PROMPT))
    last = [_pixels(page, c) for c in ("canvas.big:not(.scores)", "canvas.scores")]
    cells = page.eval_on_selector_all(".headgrid .hcell", "cs => cs.map(c => c.dataset.value)")
    _scrub_to(page, 0)
    assert page.text_content("#steplabel") == "step 2"
    assert "step 2" in page.text_content(".run .panel h3")
    first = [_pixels(page, c) for c in ("canvas.big:not(.scores)", "canvas.scores")]
    assert first[0] != last[0] and first[1] != last[1]
    assert (
        page.eval_on_selector_all(".headgrid .hcell", "cs => cs.map(c => c.dataset.value)") != cells
    )
    # The maps at step 2 are that checkpoint's own, as lm computes them.
    _check_hover(page, 0, _weights(runs.scrub, PROMPT, "step_00000002"))
    assert opened.errors == []
    page.close()
    named = runs.root / "scrub-6-2.html"
    argv = ["view", str(runs.scrub), "--prompt", PROMPT, "--steps", "6,2", "--out", str(named)]
    assert main(argv) == 0
    held = json.loads(re.search(r'id="lm-data">(.*?)</script>', named.read_text(), re.S).group(1))
    assert [c["step"] for c in held["runs"][0]["checkpoints"]] == [2]
    assert held["runs"][0]["step"] == 6
    opened = _open(browser, named.as_uri())
    assert opened.page.get_attribute("#step", "max") == "1"
    assert opened.page.text_content("#steplabel") == "step 6"  # the last named step first
    _check_hover(opened.page, 0, _weights(runs.scrub, PROMPT, "step_00000006"))
    assert opened.errors == []
    opened.page.close()


def _shown_score(page, T: int, q: int, k: int) -> str:
    box = page.query_selector("canvas.scores").bounding_box()
    x, y = box["x"] + (k + 0.5) * box["width"] / T, box["y"] + (q + 0.5) * box["height"] / T
    page.mouse.move(x, y)
    return page.text_content("#tip").split("score ")[-1]


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_the_signed_score_panel_shows_lms_scores_diverging_about_zero(runs, browser, name):
    opened = _open(browser, _page(runs, name).as_uri())
    page = opened.page
    scores, _ = _maps(getattr(runs, name), PROMPT)
    L, H, T, _ = scores.shape
    page.select_option("#layer", str(L - 1))
    page.select_option("#head", str(H - 1))
    title = page.text_content(".panel:nth-child(2) h3")
    assert ("S + B + M" if name == "alibi" else "S + M before softmax") in title
    for q, k in ((T - 1, 0), (T // 2, T // 2 - 1), (3, 3)):
        shown = float(_shown_score(page, T, q, k))
        assert shown == pytest.approx(scores[L - 1, H - 1, q, k], abs=0.5e-3 + 1e-9)
    assert _shown_score(page, T, 2, 5) == "masked"
    # Colour: red above 0, blue below, the legend's scale the head's largest |score|.
    row = scores[L - 1, H - 1]
    m = np.abs(row[np.tril_indices(T)]).max()
    legend = page.eval_on_selector_all(
        ".panel:nth-child(2) .legendbar text", "t => t.map(x => x.textContent)"
    )
    assert float(legend[2]) == pytest.approx(m, abs=0.5e-3) and float(legend[0]) == -float(
        legend[2]
    )
    q, k = np.unravel_index(np.argmax(np.where(np.tri(T) > 0, row, -np.inf)), row.shape)
    rgb = page.eval_on_selector(
        "canvas.scores",
        "(c, qk) => [...c.getContext('2d').getImageData(qk[1], qk[0], 1, 1).data]",
        [int(q), int(k)],
    )
    assert rgb[0] > rgb[2]  # the largest score is red
    assert opened.errors == []
    page.close()


def _downloaded(page, selector: str) -> tuple[str, bytes]:
    with page.expect_download() as got:
        page.click(selector)
    return got.value.suggested_filename, Path(got.value.path()).read_bytes()


SVG = "{http://www.w3.org/2000/svg}"


def test_every_figure_downloads_as_a_valid_svg_and_a_png(runs, browser):
    import xml.etree.ElementTree as ET

    opened = _open(browser, _page(runs, "rope").as_uri())
    page = opened.page
    T = len(load_run(runs.rope).tokenizer.encode(PROMPT))
    buttons = page.eval_on_selector_all("button.dl[data-kind=svg]", "b => b.length")
    figures = page.eval_on_selector_all(
        "canvas.big, svg.linechart, svg.barchart, svg.headgrid, canvas.longmap", "f => f.length"
    )
    assert buttons == figures  # a pair of buttons per figure
    name, svg = _downloaded(page, ".panel:nth-child(1) .fighead button.dl[data-kind=svg]")
    root = ET.fromstring(svg)
    assert name == "attention-L0-H0-step8.svg" and root.tag == f"{SVG}svg"
    assert len(root.findall(f".//{SVG}rect[@class='cell']")) == T * (T + 1) // 2
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert texts[0].startswith("Attention A = softmax_row(S + M): layer 0, head 0") and "1" in texts
    name, svg = _downloaded(page, ".panel:nth-child(3) .fighead button.dl[data-kind=svg]")
    root = ET.fromstring(svg)
    assert name == "heads-previous-token-step8.svg"
    assert len(root.findall(f".//{SVG}rect[@class='hcell']")) == 4
    assert {"L0", "L1", "H0", "H1"} <= {t.text for t in root.iter(f"{SVG}text")}
    _, svg = _downloaded(page, ".chart.signal .fighead button.dl[data-kind=svg]")
    root = ET.fromstring(svg)
    assert len(root.findall(f".//{SVG}path")) == 1 and root.find(f"{SVG}style") is not None
    assert "distance n" in {t.text for t in root.iter(f"{SVG}text")}
    name, png = _downloaded(page, ".panel:nth-child(2) .fighead button.dl[data-kind=png]")
    assert name.endswith(".png") and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert opened.errors == []
    assert [u for u in opened.requests if u.startswith(("http", "ws"))] == []
    page.close()


def test_clicking_a_head_in_the_grid_opens_its_maps(runs, browser):
    opened = _open(browser, _page(runs, "alibi").as_uri())
    page = opened.page
    data = json.loads(page.text_content("#lm-data"))["runs"][0]["heads"]
    shown = page.eval_on_selector_all(".headgrid .hcell", "cs => cs.map(c => +c.dataset.value)")
    assert shown == [v for row in data["previous_token"] for v in row]
    page.select_option("#headscore", "induction")
    shown = page.eval_on_selector_all(".headgrid .hcell", "cs => cs.map(c => +c.dataset.value)")
    assert shown == [v for row in data["induction"] for v in row]
    page.click('.headgrid .hcell[data-layer="1"][data-head="0"]')
    assert page.input_value("#layer") == "1" and page.input_value("#head") == "0"
    assert page.get_attribute("canvas.big:not(.scores)", "data-layer") == "1"
    assert page.get_attribute("canvas.scores", "data-head") == "0"
    assert page.input_value("#headscore") == "induction"  # the chosen score stays
    assert opened.errors == []
    page.close()


def test_a_passkey_runs_page_draws_lm_evals_grid_and_k_max(tmp_path, browser, capsys):
    run = _train(
        tmp_path,
        "passkey",
        model={"context_length": 64},
        data={"source": "builtin:passkey", "mode": "padded", "task_examples": 60,
              "task_eval_examples": 2, "passkey_lengths": "1x,2x", "passkey_depths": 3},
        train={"max_steps": 2, "eval_every": 0, "checkpoint_every": 2},
    )  # fmt: skip
    prompt = "The pass key is"
    before = tmp_path / "before.html"
    assert main(["view", str(run), "--prompt", prompt, "--out", str(before)]) == 0
    assert main(["eval", str(run)]) == 0
    capsys.readouterr()
    saved = json.loads((run / "eval.json").read_text())
    out = tmp_path / "after.html"
    assert main(["view", str(run), "--prompt", prompt, "--out", str(out)]) == 0
    opened = _open(browser, before.as_uri())
    assert f"lm eval {run} measures the passkey grid" in opened.page.text_content(".note")
    opened.page.close()
    opened = _open(browser, out.as_uri())
    page = opened.page
    found = "none" if saved["k_max"] is None else saved["k_max"]
    assert f"k_max {found} (lm eval, step 2)" in page.text_content(".panel:has(svg.passkey) h3")
    texts = page.eval_on_selector_all("svg.passkey text", "t => t.map(x => x.textContent)")
    want = ["depth of the key", "0%", "50%", "100%"]
    for r in saved["accuracy"]:
        want += [f"{r['length']}{' (1x)' if r['trained'] else ''}"]
        want += [f"{round(100 * c['accuracy'])}%" for c in r["depths"]]
    assert texts == want and want[4:6] == ["64 (1x)", want[5]]
    assert len(page.query_selector_all("svg.passkey rect.pcell")) == 2 * 3
    _, svg = _downloaded(page, ".panel:has(svg.passkey) .fighead button.dl[data-kind=svg]")
    import xml.etree.ElementTree as ET

    assert len(ET.fromstring(svg).findall(f".//{SVG}rect[@class='pcell']")) == 6
    assert opened.errors == []
    page.close()
