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
