"""The documentation site (mkdocs.yml, docs/): it builds with `mkdocs build --strict`, its generated reference
says exactly what the code has (every field of sweep.yaml, every command and option, every variable of the run
contract), every shell block of orch in the docs is run by a test or marked as not runnable here, and a real
browser finds a page through the built site's search box. The code is read here a second way, independent of
scripts/mkdocs_hooks.py (the models' fields from pydantic, not their JSON schema; click's tree, not mkdocs-click)."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import typing
import urllib.error
import urllib.request
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import click
import pytest
from pydantic import BaseModel

from orchestrator.wait import retry_until
from tests.conftest import ROOT

MKDOCS = Path(sys.executable).with_name("mkdocs")


def build(site: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_MKDOCS_2_WARNING="1")
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(out)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text()


# --- the build --------------------------------------------------------------------------------------------------


def test_the_site_builds_strictly_with_every_page_of_docs_in_its_nav(site):
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages, "docs/ has no pages"
    assert not [p for p in pages if p not in nav], "pages of docs/ that the nav of mkdocs.yml leaves out"
    for generated in ("reference/sweep-file", "reference/cli", "reference/aws-calls", "concepts/lifecycle"):
        assert (site / generated / "index.html").exists(), generated


def test_a_broken_link_fails_the_strict_build(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\n[gone](guides/no-such-page.md)\n")
    config = tmp_path / "mkdocs.yml"
    text = (ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    config.write_text(text.replace("scripts/mkdocs_hooks.py", str(ROOT / "scripts" / "mkdocs_hooks.py")))
    done = build(tmp_path / "site", config)
    assert done.returncode != 0 and "no-such-page.md" in done.stderr, done.stderr[-2000:]


# --- the sweep file's reference: every field of the models, and no other -----------------------------------------


def _models_in(annotation) -> typing.Iterator[tuple[str, type]]:
    """(how the field holds it: "" / "[]" / ".NAME", model) for each pydantic model inside an annotation."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield "", annotation
        return
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, typing.Sequence) and args:
        yield from (("[]", m) for _, m in _models_in(args[0]))
    elif origin in (dict, typing.Mapping) and len(args) == 2:
        yield from ((".NAME", m) for _, m in _models_in(args[1]))
    else:
        for arg in args:
            yield from _models_in(arg)


def field_paths(model: type, prefix: str = "") -> set[str]:
    found = set()
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        found.add(path)
        for how, sub in _models_in(info.annotation):
            found |= field_paths(sub, f"{path}{how}.")
    return found


def test_the_sweep_file_reference_lists_every_field_of_the_models_and_no_other(site):
    from orchestrator.backends import registry
    from orchestrator.sweep.spec import SweepSpec

    expected = field_paths(SweepSpec)
    for entry in registry.BACKENDS:
        expected |= field_paths(entry.schema.settings, f"{entry.name}.")
    shown = {html.unescape(i) for i in re.findall(r'<code id="field-([^"]+)">', page(site, "reference/sweep-file"))}
    assert not expected - shown, f"fields the code has and the reference lacks: {sorted(expected - shown)}"
    assert not shown - expected, f"fields the reference shows and the code lacks: {sorted(shown - expected)}"


def test_every_field_of_the_sweep_file_has_a_description_in_the_reference(site):
    text = page(site, "reference/sweep-file")
    rows = [r for r in re.findall(r"<tr>(.*?)</tr>", text, re.S) if 'id="field-' in r]
    assert rows
    cells = [re.findall(r"<td>(.*?)</td>", r, re.S) for r in rows]
    empty = [re.search(r'id="field-([^"]+)"', c[0]).group(1) for c in cells if not c[-1].strip()]
    assert not empty, f"fields with no description (add description= to the model's Field): {empty}"


# --- the CLI's reference: every command and option, and no other ----------------------------------------------


def commands(cmd: click.Command, path: str = "orch", parent=None) -> typing.Iterator[tuple[str, click.Command]]:
    """Every command `--help` shows, found through click (a LazyGroup imports each; one it hides is left out)."""
    ctx = click.Context(cmd, info_name=path.rsplit(" ", 1)[-1], parent=parent)
    yield path, cmd
    if isinstance(cmd, click.Group):
        lazy = getattr(cmd, "lazy", {})
        for name in dict.fromkeys(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden and (name not in lazy or lazy[name][1] is not None):
                yield from commands(sub, f"{path} {name}", ctx)


def sections(text: str) -> dict[str, str]:
    """The CLI page cut at each command's heading (id orch-ami-build), keyed by the command's id."""
    parts = re.split(r'<h\d id="(orch[a-z0-9-]*)"', text)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_the_cli_reference_lists_every_command_and_option_and_no_other(site):
    from orchestrator.cli.main import main

    shown = sections(page(site, "reference/cli"))
    tree = {path.replace(" ", "-"): cmd for path, cmd in commands(main)}
    assert set(tree) == set(shown), (sorted(set(tree) - set(shown)), sorted(set(shown) - set(tree)))
    for key, cmd in tree.items():
        options = {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}
        options |= {"-h", "--help"}
        listed = set(re.findall(r"<td>(?:<code>[^<]+</code>(?:, )?)+", shown[key]))
        listed = {o for cell in listed for o in re.findall(r"<code>(-[^<]+)</code>", cell)}
        assert options == listed, (key, sorted(options - listed), sorted(listed - options))
        for arg in (p for p in cmd.params if isinstance(p, click.Argument)):
            assert arg.human_readable_name in shown[key], (key, arg.human_readable_name)


# --- the run contract's environment, and a run's life ----------------------------------------------------------


def test_the_run_contract_page_explains_every_orch_variable_the_code_uses(site):
    used = set()
    for source in (ROOT / "orchestrator").rglob("*.py"):
        if source.parent.name == "cli":  # its help's examples (ORCH_SLACK=...), not variables orch reads or sets
            continue
        used |= set(re.findall(r"\bORCH_[A-Z][A-Z_]*[A-Z]\b", source.read_text()))
    assert {"ORCH_RUN_DIR", "ORCH_PARAMS_JSON", "ORCH_HOME"} <= used
    text = page(site, "reference/run-contract")
    assert not [v for v in sorted(used) if v not in text], "ORCH_ variables the run contract page does not explain"


def test_the_lifecycle_diagram_draws_every_state_a_record_may_hold(site):
    from orchestrator.store.lifecycle import RunState

    text = html.unescape(page(site, "concepts/lifecycle"))
    diagram = text.split('class="mermaid"', 1)[1].split("</pre>", 1)[0]
    assert "stateDiagram-v2" in diagram
    drawn = set(re.findall(r"(\w+) --&gt; |(\w+) --> ", diagram))
    drawn = {a or b for a, b in drawn} | set(re.findall(r"--> (\w+)", diagram))
    assert {s.value for s in RunState} <= drawn, {s.value for s in RunState} - drawn


# --- every shell block of orch: run by a test, or marked as not runnable here -----------------------------------

# `run-by: TEST.py`: that test reads the block from this page and runs it; `tested-by: TEST.py::NAME`: that test runs
# the same commands on its own files; `not-run: WHY`: it cannot run here (AWS), said why.
MARK = re.compile(
    r"<!-- (run-by: (?P<reader>tests/\S+\.py)"
    r"|tested-by: (?P<test>tests/\S+\.py)::(?P<name>\w+)"
    r"|not-run: (?P<why>[^>]+)) -->"
)
ORCH_LINE = re.compile(r"^\s*(\$ )?(orch|\.venv/bin/orch|\.venv/bin/python -m orchestrator\.cli) ", re.M)


def shell_blocks(text: str) -> typing.Iterator[tuple[int, str, str]]:
    """(line, the line before the fence, the block) for each fenced block of a shell language or none."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*```(\w*)", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
        if fence.group(1) in ("", "bash", "sh", "shell", "console"):
            yield i + 1, lines[i - 1] if i else "", "\n".join(lines[i + 1 : end])
        i = end + 1


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_orch_shell_block_in_the_docs_is_run_by_a_test_or_marked_not_runnable_here():
    unmarked, wrong = [], []
    for doc in doc_files():
        name = str(doc.relative_to(ROOT))
        for line, before, block in shell_blocks(doc.read_text()):
            if not ORCH_LINE.search(block):
                continue
            mark = MARK.search(before)
            if mark is None:
                unmarked.append(f"{name}:{line}")
            elif mark.group("reader"):
                test = ROOT / mark.group("reader")
                if not test.exists() or name not in test.read_text():
                    wrong.append(f"{name}:{line}: {mark.group('reader')} does not read {name}")
            elif mark.group("test"):
                test = ROOT / mark.group("test")
                if not test.exists() or f"def {mark.group('name')}(" not in test.read_text():
                    wrong.append(f"{name}:{line}: no test {mark.group('test')}::{mark.group('name')}")
    assert not unmarked, (
        "shell blocks of orch with no mark on the line before the fence: `<!-- run-by: tests/FILE.py -->` (that test "
        "reads and runs it), `<!-- tested-by: tests/FILE.py::TEST -->` or `<!-- not-run: WHY -->` (e.g. AWS): "
        f"{unmarked}"
    )
    assert not wrong, wrong


def test_the_shell_block_check_sees_an_unmarked_block():
    text = "intro\n```bash\norch launch x.yaml\n```\n<!-- not-run: AWS -->\n```bash\norch down x\n```\n"
    found = [(before, block) for _, before, block in shell_blocks(text) if ORCH_LINE.search(block)]
    assert [MARK.search(before) is None for before, _ in found] == [True, False]


# --- the tests page says where each kind of test lives ----------------------------------------------------------


def test_the_tests_page_names_every_folder_of_tests_and_every_path_it_names_exists():
    text = (ROOT / "docs/concepts/tests.md").read_text()
    named = set(re.findall(r"`(tests/[\w./-]+)`", text))  # templates (`tests/unit/<package>/...`) left out
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/concepts/tests.md names paths that do not exist: {missing}"
    unit = ROOT / "tests/unit"

    def covered(test: Path) -> bool:
        folder = test.parent.relative_to(ROOT)
        if f"{folder}/" in named or str(test.relative_to(ROOT)) in named:
            return True
        # tests/unit mirrors orchestrator/: its row names each package as `sweep/`, `backends/aws/`, ...
        return test.is_relative_to(unit) and f"`{test.parent.relative_to(unit)}/`" in text

    unnamed = sorted(str(t.relative_to(ROOT)) for t in (ROOT / "tests").rglob("test_*.py") if not covered(t))
    assert not unnamed, f"tests in a folder docs/concepts/tests.md's table does not name: {unnamed}"


# --- served locally, and searched in a real browser -----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> str | None:
    try:
        return urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return None


@pytest.mark.timeout(300)
def test_scripts_docs_sh_builds_and_serves_the_site(tmp_path):
    port = free_port()
    env = dict(os.environ, ORCH_DOCS_ADDR=f"127.0.0.1:{port}", TMPDIR=str(tmp_path), NO_MKDOCS_2_WARNING="1")
    proc = subprocess.Popen(
        [str(ROOT / "scripts" / "docs.sh")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        home = retry_until(lambda: answers(f"http://127.0.0.1:{port}/"), 240, 0.5, "mkdocs serve to answer")
        assert "<title>orch</title>" in home or "orch" in home
        assert (tmp_path / "orch-site" / "reference" / "cli" / "index.html").exists()  # the strict build first
    finally:
        proc.terminate()
        proc.wait(30)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def webdriver(base: str, method: str, path: str, body: dict | None = None) -> typing.Any:
    """One call of the W3C WebDriver protocol (JSON over HTTP) to chromedriver."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        return json.loads(urllib.request.urlopen(request, timeout=120).read())["value"]
    except urllib.error.HTTPError as e:  # the driver's answer says why
        raise AssertionError(f"{method} {path}: {e.code} {e.read()[:2000]!r}") from None


@contextlib.contextmanager
def browser(site: Path, tmp_path: Path, size: str = "1400,900"):
    """A real headless Chromium (through chromedriver) on the built site served on loopback: yields (call, home),
    `call(method, path, body)` speaking WebDriver to the session and `home` the site's address."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/setup.sh dev installs them)")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = free_port()
    chromedriver = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        retry_until(lambda: answers(base + "/status"), 60, 0.2, "chromedriver to answer")
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={size}"]
        args.append(f"--user-data-dir={tmp_path}")
        caps = {"browserName": "chrome", "goog:chromeOptions": {"binary": chromium, "args": args}}
        session = webdriver(base, "POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]
        s = f"/session/{session}"
        try:
            yield (
                lambda method, path, body=None: webdriver(base, method, s + path, body),
                f"http://127.0.0.1:{server.server_address[1]}/",
            )
        finally:
            webdriver(base, "DELETE", s)
    finally:
        chromedriver.terminate()
        chromedriver.wait(30)
        server.shutdown()


@pytest.mark.timeout(300)
def test_a_real_browser_finds_the_admin_page_through_the_built_sites_search_box(site, tmp_path):
    with browser(site, tmp_path) as (call, home):
        call("POST", "/url", {"url": home})
        box = call("POST", "/element", {"using": "css selector", "value": "input.md-search__input"})
        box_id = next(iter(box.values()))
        call("POST", f"/element/{box_id}/click", {})
        call("POST", f"/element/{box_id}/value", {"text": "permissions boundary admin"})

        def links():
            found = call("POST", "/elements", {"using": "css selector", "value": "a.md-search-result__link"})
            hrefs = [call("GET", f"/element/{next(iter(e.values()))}/attribute/href") for e in found]
            return [h for h in hrefs if h and "getting-started/admin/" in h]

        hits = retry_until(links, 120, 0.5, "the search box to list the admin's page")
        call("POST", "/url", {"url": hits[0]})
        assert "admin" in call("GET", "/title").lower()


# What a laptop's screen shows of the generated sweep-file reference: each field name on one line, each table
# within the page (Material scrolled it sideways, and broke `description` into `descripti on`).
TABLES_AS_SEEN = """
const broken = [], cut = [];
const page = document.querySelector('.md-content__inner').getBoundingClientRect();
for (const table of document.querySelectorAll('.md-typeset table')) {
  const box = table.getBoundingClientRect();
  if (box.right > page.right + 1) cut.push(table.rows[0].innerText.slice(0, 40) + ' ' + Math.round(box.right));
  for (const row of table.rows) {
    const code = row.cells[0] && row.cells[0].querySelector('code');
    if (code && code.getClientRects().length > 1) broken.push(code.innerText);
  }
}
return {broken, cut, right: Math.round(page.right)};
"""


@pytest.mark.timeout(300)
def test_the_sweep_file_reference_reads_whole_at_a_laptops_width(site, tmp_path):
    with browser(site, tmp_path, "1300,900") as (call, home):
        call("POST", "/url", {"url": home + "reference/sweep-file/"})
        seen = call("POST", "/execute/sync", {"script": TABLES_AS_SEEN, "args": []})
    assert seen["broken"] == [] and seen["cut"] == [], seen


# --- the README: short, and pointing into the site ---------------------------------------------------------------


def test_the_readme_stays_under_200_lines_and_each_of_its_links_reaches_a_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, "README.md is for the two commands and the way in: move the rest to docs/"
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert links and not [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
