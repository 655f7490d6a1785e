"""Headless Chromium (Debian's chromium + chromium-driver) driven by Selenium, as a person uses the UIs.

Nothing is downloaded at run time: Selenium is pointed at /usr/bin/chromium and /usr/bin/chromedriver (its own
driver manager never runs). Every page that matters is saved as a screenshot under `shots`, so a failing test
leaves what it saw behind.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# Where screenshots go (each test's under its own folder).
SHOTS = Path(os.environ.get("POSTTRAIN_SCREENSHOTS", REPO / "build" / "browser-screenshots"))
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1200",
)


def airflow_token(airflow_url: str, user: str, password: str) -> str:
    """A JWT from Airflow's simple auth manager (POST /auth/token): the UI keeps it in the `_token` cookie."""
    req = urllib.request.Request(
        f"{airflow_url}/auth/token",
        method="POST",
        data=json.dumps({"username": user, "password": password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)["access_token"]


def api(airflow_url: str, token: str, path: str, method: str = "GET", body: dict | None = None) -> Any:
    """Airflow's REST API (/api/v2): GET by default, or `method` with a JSON `body`."""
    req = urllib.request.Request(
        f"{airflow_url}/api/v2/{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)


def wait_for_dag(airflow_url: str, token: str, dag_id: str, timeout_s: float = 180) -> None:
    """The DAG processor parses the DAG files shortly after start; the API and UI know a DAG only after that."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            api(airflow_url, token, f"dags/{dag_id}")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"after {timeout_s:.0f}s: DAG {dag_id} was never parsed") from None
            time.sleep(2)


def newest_run(airflow_url: str, token: str, dag_id: str) -> tuple[str, dict] | None:
    """The newest run of `dag_id` (id and conf), or None before the first."""
    runs = api(airflow_url, token, f"dags/{dag_id}/dagRuns?order_by=-start_date&limit=1")["dag_runs"]
    return (runs[0]["dag_run_id"], runs[0]["conf"]) if runs else None


class Browser:
    """One Chromium session with a fresh profile; `shot(name)` saves a numbered screenshot."""

    def __init__(self, profile_dir: Path, shots: Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}"):
            options.add_argument(flag)
        self.driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        self.driver.set_page_load_timeout(60)
        self.shots = shots
        self.shots.mkdir(parents=True, exist_ok=True)
        self._n = 0

    def shot(self, name: str) -> Path:
        self._n += 1
        path = self.shots / f"{self._n:02d}-{re.sub(r'[^A-Za-z0-9_-]+', '-', name)}.png"
        self.driver.save_screenshot(str(path))
        return path

    def quit(self) -> None:
        self.driver.quit()

    def log_in_to_airflow(self, airflow_url: str, token: str) -> None:
        self.driver.get(f"{airflow_url}/")
        self.driver.add_cookie({"name": "_token", "value": token, "path": "/"})

    # ----- finding things --------------------------------------------------------------------------------------
    def find(self, xpath: str, timeout_s: float = 30) -> Any:
        return self.wait_for(lambda: self._first(xpath), timeout_s, f"no element {xpath}")

    def _first(self, xpath: str) -> Any:
        from selenium.webdriver.common.by import By

        found = [e for e in self.driver.find_elements(By.XPATH, xpath) if e.is_displayed()]
        return found[0] if found else None

    def wait_for(
        self,
        probe: Callable[[], Any],
        timeout_s: float,
        what: str,
        every_s: float = 0.5,
        refresh_every_s: float | None = None,
    ) -> Any:
        """Poll `probe` until it returns something truthy; reload the page every `refresh_every_s` if given."""
        from selenium.common.exceptions import WebDriverException

        deadline = time.monotonic() + timeout_s
        last_refresh = time.monotonic()
        while True:
            try:
                value = probe()
            except (WebDriverException, OSError):
                value = None  # the page re-rendered under us, or a busy API server answered late: look again
            if value:
                return value
            if time.monotonic() > deadline:
                self.shot("timeout")
                raise AssertionError(f"after {timeout_s:.0f}s: {what}")
            if refresh_every_s and time.monotonic() - last_refresh > refresh_every_s:
                self.driver.refresh()
                last_refresh = time.monotonic()
            time.sleep(every_s)

    def text(self) -> str:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.TAG_NAME, "body").text

    # ----- the Airflow trigger form ------------------------------------------------------------------------------
    def open_trigger_form(self, airflow_url: str, dag_id: str) -> Any:
        self.driver.get(f"{airflow_url}/dags/{dag_id}")
        self.find("//button[@aria-label='Trigger Dag']").click()
        return self.find("//*[@role='dialog']//button[normalize-space()='Trigger']")

    def open_section(self, name: str) -> None:
        """Expand a form section (an accordion item; opening one closes the others)."""
        button = self.find(
            f"//button[substring(@aria-controls, string-length(@aria-controls) - "
            f"string-length(':content:{name}') + 1) = ':content:{name}']"
        )
        if button.get_attribute("aria-expanded") != "true":
            button.click()
        time.sleep(0.5)

    def field_row(self, label: str) -> Any:
        """The form row whose label reads `label` (the label text plus the required marker, if any)."""
        return self.find(
            f"//*[@role='dialog']//label[starts-with(normalize-space(), '{label}')]/ancestor::*"
            f"[.//*[contains(@class, 'monaco-editor') or self::input or self::button]][1]"
        )

    def paste_into_code_editor(self, label: str, text: str) -> None:
        """Replace the JSON in the code editor of field `label` as a person pastes it: click into the editor,
        select all, delete, paste. (Typed key by key, the editor's own bracket closing and suggestions race the
        keystrokes; a paste goes in whole.) The paste is a real `paste` event on the focused editor, carrying
        the text, because a headless browser has no system clipboard to paste from."""
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        row = self.field_row(label)
        row.find_element("xpath", ".//*[contains(@class, 'monaco-editor')]//*[contains(@class, 'view-lines')]").click()
        ActionChains(self.driver).key_down(Keys.CONTROL).send_keys("a").key_up(Keys.CONTROL).send_keys(
            Keys.DELETE
        ).perform()
        self.driver.execute_script(
            "const data = new DataTransfer(); data.setData('text/plain', arguments[0]);"
            "document.activeElement.dispatchEvent(new ClipboardEvent('paste', "
            "{clipboardData: data, bubbles: true, cancelable: true}));",
            text,
        )
        time.sleep(0.5)

    def set_number(self, label: str, value: int) -> None:
        """Type `value` into the number field `label`, replacing what is there."""
        from selenium.webdriver.common.keys import Keys

        field = self.field_row(label).find_element("xpath", ".//input")
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(str(value))
        field.send_keys(Keys.TAB)

    def check(self, label: str) -> None:
        """Switch on the boolean field `label` (a checkbox or switch) if it is off."""
        row = self.field_row(label)
        box = row.find_element("xpath", ".//input[@type='checkbox']")
        if not box.is_selected():
            control = row.find_elements("xpath", ".//*[@data-part='control'] | .//label[.//input]")
            self.driver.execute_script("arguments[0].click();", control[0] if control else box)
        self.wait_for(lambda: box.is_selected(), 5, f"{label} did not switch on")
