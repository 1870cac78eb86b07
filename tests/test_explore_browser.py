"""ta.viz.explore in a real browser: headless Chromium, driven by Selenium, opens the page over
file://, hovers tokens, and reads back from the page the weights it highlights, which must be
the model's (from its own forward, computed here independently of the page); switching the
attention, layer, head and hypothesis changes them accordingly.  Each test saves a screenshot.

Needs Selenium (``pip install selenium``) and Chromium with its driver (Debian: ``apt-get install
chromium chromium-driver``); without them the tests skip, or fail under
TINYGRAD_ATTN_REQUIRE_EXTRAS=1."""

import shutil

import numpy as np
import pytest

import tinygrad_attn as ta
from tests import optional
from tests.test_explore import MAX_LEN, TEXT, WORDS, never_ends, teacher_forced

webdriver = optional.module("selenium.webdriver", "Selenium is not installed: the browser tests need "
                                                  "`pip install selenium`")
if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
    optional.missing("Chromium or chromedriver is not installed (Debian: apt-get install chromium "
                     "chromium-driver)")

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

ATOL = 2e-6          # the page's 6 decimals, and a mean of rounded heads


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900", "--allow-file-access-from-files"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(service=service, options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def task():
    vocab = ta.data.Vocab(WORDS)
    return ta.data.Task.empty("hostile", vocab, vocab, {"src": "space", "tgt": "space", "lowercase": False})


def open_page(browser, explorer, path):
    explorer.save(path)
    browser.get(path.resolve().as_uri())
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1"


def tokens(browser, side):
    return browser.find_elements(By.CSS_SELECTOR, f".token[data-side='{side}']")


def hover(browser, side, index):
    """Hover token ``index`` of ``side`` ("key" or "query"); the other side's weights, as read
    from the page (unrounded, from data-weight)."""
    ActionChains(browser).move_to_element(tokens(browser, side)[index]).perform()
    other = "query" if side == "key" else "key"
    return np.array([float(t.get_attribute("data-weight")) for t in tokens(browser, other)])


def choose(browser, **selects):
    for name, value in selects.items():
        Select(browser.find_element(By.ID, name)).select_by_value(str(value))


def no_script_errors(browser):
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, errors


def test_browser_transformer_hover_reads_back_every_layer_and_head(browser, task, tmp_path):
    ta.manual_seed(0)
    model = ta.models.Transformer(task.src_vocab, task.tgt_vocab, d_model=16, nhead=2, num_encoder_layers=2,
                                  num_decoder_layers=2, dim_feedforward=32, dropout=0.0, max_len=32)
    never_ends(model)
    model.eval()
    source = task.tokenize(TEXT)
    ids, decoded = model.greedy(ta.data.encode_batch([source], task.src_vocab), max_len=MAX_LEN)
    rows = task.tgt_vocab.decode(ids[0])
    reference = teacher_forced(model, task, source, rows)
    open_page(browser, ta.viz.explore(model, TEXT, task, max_len=MAX_LEN), tmp_path / "transformer.html")

    # Nothing was fetched: the page is all there is.
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    # Tokens arrive as text, hostile ones included; none became an element.
    assert [t.find_element(By.CLASS_NAME, "label").text for t in tokens(browser, "key")] == source
    assert browser.find_elements(By.TAG_NAME, "b") == []
    # At first: the last layer's cross-attention averaged over the heads, what decoding read.
    for j in (0, 1, 3):
        np.testing.assert_allclose(hover(browser, "key", j), decoded[0, :, j], atol=1e-5)
        np.testing.assert_allclose(hover(browser, "key", j), reference["cross"][-1, :, :, j].mean(axis=0),
                                   atol=ATOL)
    # A source token's lines: one per output token it has a visible weight for, the rest hidden.
    hover(browser, "key", 3)
    lines = browser.find_elements(By.CSS_SELECTOR, "#lines line")
    shown = [line for line in lines if line.value_of_css_property("visibility") == "visible"]
    assert {line.get_attribute("data-key") for line in shown} == {"3"}
    assert len(shown) == np.sum(reference["cross"][-1, :, :, 3].mean(axis=0) >= 0.002)
    assert all(float(line.get_attribute("stroke-opacity")) > 0 for line in shown)

    choose(browser, layer=0, head=1)
    np.testing.assert_allclose(hover(browser, "key", 2), reference["cross"][0, 1, :, 2], atol=ATOL)
    np.testing.assert_allclose(hover(browser, "query", 4), reference["cross"][0, 1, 4], atol=ATOL)

    choose(browser, kind="encoder")
    choose(browser, layer=1, head=0)
    np.testing.assert_allclose(hover(browser, "query", 1), reference["encoder"][1, 0, 1], atol=ATOL)
    np.testing.assert_allclose(hover(browser, "key", 5), reference["encoder"][1, 0, :, 5], atol=ATOL)

    choose(browser, kind="decoder")
    choose(browser, layer=1, head="mean")
    row = hover(browser, "query", 3)
    np.testing.assert_allclose(row, reference["decoder"][1, :, 3].mean(axis=0), atol=ATOL)
    assert np.all(row[4:] == 0)                                     # causal
    labels = [t.find_element(By.CLASS_NAME, "label").text for t in tokens(browser, "key")]
    assert labels == ["<start>", *rows[:-1]]

    # The matrix beside the lines holds the same weights, one cell each.
    cells = browser.find_elements(By.CSS_SELECTOR, "#matrix td")
    assert len(cells) == len(rows) ** 2
    grid = np.array([float(c.get_attribute("data-weight")) for c in cells]).reshape(len(rows), len(rows))
    np.testing.assert_allclose(grid, reference["decoder"][1].mean(axis=0), atol=ATOL)
    hover(browser, "key", 0)
    browser.save_screenshot(str(tmp_path / "transformer.png"))
    no_script_errors(browser)


def test_browser_seq2seq_n_best_switches_hypothesis(browser, task, tmp_path):
    ta.manual_seed(1)
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=8, hidden=16, attention="general").eval()
    never_ends(model)
    source = task.tokenize(TEXT)
    found = model.beam_search(ta.data.encode_batch([source], task.src_vocab), beam=3, max_len=MAX_LEN,
                              n_best=3)[0]
    open_page(browser, ta.viz.explore(model, TEXT, task, beam=3, n_best=3, max_len=MAX_LEN),
              tmp_path / "seq2seq.html")
    rows = browser.find_elements(By.CSS_SELECTOR, "#nbest tr.row")
    assert len(rows) == 3 and "chosen" in rows[0].get_attribute("class")
    assert Select(browser.find_element(By.ID, "head")).first_selected_option.text == "the one head"
    np.testing.assert_allclose(hover(browser, "key", 2), found[0].attention[:, 2], atol=ATOL)
    rows[2].click()
    labels = [t.find_element(By.CLASS_NAME, "label").text for t in tokens(browser, "query")]
    assert labels == task.tgt_vocab.decode(found[2].tokens)
    for j in range(len(source)):
        np.testing.assert_allclose(hover(browser, "key", j), found[2].attention[:, j], atol=ATOL)
    np.testing.assert_allclose(hover(browser, "query", 1), found[2].attention[1], atol=ATOL)
    browser.save_screenshot(str(tmp_path / "seq2seq.png"))
    no_script_errors(browser)


def test_browser_notebook_iframe_runs_the_page(browser, task, tmp_path):
    ta.manual_seed(2)
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=8, hidden=16, attention="dot").eval()
    never_ends(model)
    explorer = ta.viz.explore(model, TEXT, task, max_len=MAX_LEN)
    source = task.tokenize(TEXT)
    _, attention = model.greedy(ta.data.encode_batch([source], task.src_vocab), max_len=MAX_LEN)
    # What Jupyter puts in a notebook's output cell, inside a page of the notebook's own.
    notebook = tmp_path / "notebook.html"
    notebook.write_text(f"<!DOCTYPE html><html><body><h1>cell</h1>{explorer._repr_html_()}</body></html>",
                        encoding="utf-8")
    browser.get(notebook.resolve().as_uri())
    browser.switch_to.frame(browser.find_element(By.TAG_NAME, "iframe"))
    try:
        assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1"
        np.testing.assert_allclose(hover(browser, "key", 1), attention[0, :, 1], atol=ATOL)
    finally:
        browser.switch_to.default_content()
    no_script_errors(browser)
