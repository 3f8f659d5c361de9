"""Headless Chromium through Selenium for the tests that open pages (skipped, saying why, where it is missing)."""
import shutil

import pytest


def browser(javascript: bool = True, width: int = 1200, height: int = 900):
    driver = shutil.which("chromedriver")
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not driver or not binary:
        pytest.skip("no headless browser: apt-get install chromium chromium-driver (Debian), then pip install selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={width},{height}"):
        opts.add_argument(a)
    if not javascript:
        opts.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


def open_widget(path, body: str):
    """`body` (a report widget's HTML) written to `path` as a page and opened in headless Chromium, its console
    checked for errors and warnings; the browser is returned open (the caller quits it)."""
    import time

    path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{body}</body></html>")
    b = browser()
    try:
        b.get(path.resolve().as_uri())
        time.sleep(0.3)
        assert not [e for e in b.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    except BaseException:
        b.quit()
        raise
    return b
