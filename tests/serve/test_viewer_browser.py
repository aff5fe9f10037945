"""The viewer and blind test in a real browser (Debian's Chromium driven by Playwright): pages
load without script errors and untrusted text stays text, filters work, a labelling session
survives a reload and a closed browser with every label kept, and the exported result equals
an independent binomial computation (scipy's).

`HAT_JAX_VIEWER_SCREENSHOTS=docs` also writes one screenshot per page there (`docs/viewer_*.png`).
"""

import json
import os
import pathlib
import shutil

import pytest

from serve import viewer as vw
from serve.server import serve_in_background
from tests.serve import _viewer_runs

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"no Chromium at {CHROMIUM}: the browser tests need Debian's package "
            "(`apt-get install -y chromium`; CI's .ci/run installs it)"
        )
    from playwright.sync_api import sync_playwright

    root = tmp_path_factory.mktemp("viewer")
    runs = _viewer_runs.build(root)
    viewer = vw.load_viewer(
        [runs["teacher"], runs["sim"], runs["replay"], runs["damaged"]],
        report_dir=runs["report"], blind=(runs["teacher"], runs["rules"]),
        blind_dir=root / "blind",
    )  # fmt: skip
    with serve_in_background(vw.create_viewer_app(viewer)) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield {"base": base, "browser": browser, "viewer": viewer, "runs": runs,
                   "playwright": p, "blind_dir": root / "blind"}  # fmt: skip
        finally:
            browser.close()


class Page:
    """A fresh page that records script errors and dialogs (an executed payload opens one)."""

    def __init__(self, world, browser=None):
        self.base = world["base"]
        self.context = (browser or world["browser"]).new_context(
            viewport={"width": 1280, "height": 860}
        )
        self.page = self.context.new_page()
        self.errors, self.dialogs = [], []
        self.page.on("pageerror", lambda err: self.errors.append(str(err)))
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def go(self, path):
        response = self.page.goto(self.base + path)
        assert response.status == 200, (path, response.status)
        return self.page

    def shot(self, name, full_page=False):
        folder = os.environ.get("HAT_JAX_VIEWER_SCREENSHOTS")
        if folder:
            path = pathlib.Path(folder) / f"viewer_{name}.png"
            self.page.screenshot(path=str(path), full_page=full_page)

    def close(self):
        assert not self.errors, self.errors
        assert not self.dialogs, f"a script from the run data ran: {self.dialogs}"
        self.context.close()


def _rows(page):
    return page.locator("tr.entry")


def test_pages_load_and_untrusted_text_stays_text(world):
    p = Page(world)
    page = p.go("/")
    assert page.locator("h1").inner_text() == "Runs"
    viewer = world["viewer"]
    assert _rows(page).count() == len(viewer.entries)
    # The corrupt line is named; the damaged run's other entries are listed.
    damaged = next(r for r in viewer.runs if r.path == world["runs"]["damaged"])
    assert "eval-damaged/items/t1-dev.jsonl:3: not a JSON record" in page.content()
    assert len(damaged.entries) == 8
    p.shot("index")
    xss_run = viewer.runs.index(damaged)
    page = p.go(f"/item/{xss_run}/0")
    assert _viewer_runs.XSS in page.locator("ul.comments").inner_text()  # shown as text
    assert page.locator("img[src=x]").count() == 0
    page = p.go("/item/0/1")
    assert "model call" in page.content() and "round 1" in page.content()
    page.locator("details summary", has_text="messages it saw").first.click()
    assert page.locator("details[open] pre").first.is_visible()
    sim_run = next(r for r in viewer.runs if r.kind == "sim")
    faulty = next(e for e in sim_run.entries if e.trajectory["faults"])
    page = p.go(f"/item/{faulty.run}/{faulty.index}")
    assert page.locator(".tag.bad", has_text="fault").count() > 0  # injected tool timeouts
    p.shot("item", full_page=True)
    p.go("/report")
    p.shot("report")
    p.close()


def test_filters(world):
    p = Page(world)
    viewer = world["viewer"]
    page = p.go("/")
    families = sorted({e.family for e in viewer.entries if e.family})
    family = families[1]
    page.select_option("#f-family", family)
    page.click("#apply")
    rows = _rows(page)
    expected = [e for e in viewer.entries if e.family == family]
    assert rows.count() == len(expected) > 0
    assert {rows.nth(i).get_attribute("data-family") for i in range(rows.count())} == {family}
    page = p.go("/")
    page.fill("#f-max_score", "0.9")
    page.click("#apply")
    scores = [
        float(_rows(page).nth(i).get_attribute("data-score")) for i in range(_rows(page).count())
    ]
    assert scores and max(scores) <= 0.9
    assert len(scores) == sum(e.score is not None and e.score <= 0.9 for e in viewer.entries)
    # From the report's cluster to its examples.
    page = p.go("/report")
    page.locator("#clusters a").first.click()
    assert page.url.endswith("/?cluster=c1")
    members = viewer.members["c1"]
    assert _rows(page).count() == len(members) > 0
    assert page.locator("#f-cluster").input_value() == "c1"
    p.close()


def test_a_labelling_session_survives_reload_and_a_closed_browser(world):
    viewer = world["viewer"]
    n = len(viewer.blind.pairs)
    wanted = {k: ("A", "B", "tie", "A")[k % 4] for k in range(n)}
    wanted[1] = "B"
    p = Page(world)
    page = p.go("/blind")
    for k in range(n // 2):
        assert page.url.endswith(f"/blind/{k}")
        if k == 0:
            text = page.content()
            assert "eval-teacher" not in text and "eval-rules" not in text  # blind
            page.select_option("#reason", "more accurate")
            p.shot("blind")
        page.click(f"#choose-{wanted[k]}")
    page.reload()
    assert f"{n // 2} labelled" in page.locator("#progress").inner_text()
    page = p.go("/blind/result")  # the systems stay hidden until every pair is labelled
    assert f"{n // 2} of {n} pairs labelled" in page.locator("#result").inner_text()
    assert "eval-teacher" not in page.content()
    p.close()
    # A new browser (the first one closed mid-session) resumes at the first unlabelled pair.
    other = world["playwright"].chromium.launch(executable_path=CHROMIUM, headless=True)
    try:
        q = Page(world, browser=other)
        page = q.go("/blind")
        assert page.url.endswith(f"/blind/{n // 2}")
        for k in range(n // 2, n):
            page.wait_for_url(f"**/blind/{k}")
            page.wait_for_load_state("load")  # the shortcut's script has run
            if k == n - 1:
                page.keyboard.press({"A": "a", "B": "b", "tie": "t"}[wanted[k]])  # shortcut
                page.wait_for_url("**/blind/result")
            else:
                page.click(f"#choose-{wanted[k]}")
        # A change of mind: the latest decision wins.
        page = q.go("/blind/1")
        assert page.locator("#choose-B").get_attribute("class") == "chosen"
        page.click("#choose-A")
        wanted[1] = "A"
        page = q.go("/blind/result")
        q.shot("blind_result")
        exported = page.request.get(world["base"] + "/blind/export").json()
        q.close()
    finally:
        other.close()

    session = json.loads((world["blind_dir"] / "session.json").read_text())
    by_key = {tuple(x["key"]): x["a_is"] for x in session["items"]}
    assert len(exported["labels"]) == n
    winners = []
    for label in exported["labels"]:
        k = label["position"]
        assert label["choice"] == wanted[k]
        a_is = by_key[(label["set"], label["item_id"])]
        winners.append({"A": a_is, "B": 3 - a_is, "tie": 0}[wanted[k]])
    lines = (world["blind_dir"] / "labels.jsonl").read_text().splitlines()
    assert len(lines) == n + 1  # appended: the change of mind is a line of its own
    from scipy.stats import binomtest

    wins1, wins2 = winners.count(1), winners.count(2)
    result = exported["result"]
    assert (result["wins_1"], result["wins_2"], result["ties"]) == (wins1, wins2, winners.count(0))
    assert result["win_rate_1"] == pytest.approx(wins1 / (wins1 + wins2))
    assert exported["labels"][0]["reason"] == "more accurate"
    expected = binomtest(wins1, wins1 + wins2, 0.5, alternative="two-sided").pvalue
    assert result["p_value"] == pytest.approx(expected, rel=1e-12)
