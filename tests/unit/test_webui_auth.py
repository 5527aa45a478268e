"""Who may use the web UI: local by default, a token on any other address (checked on every request), no
cross-site changes, no DNS-rebinding through the loopback binding."""

import pytest
from fastapi.testclient import TestClient

from tunesmith.webui.app import WebUIState, build_app
from tunesmith.webui.auth import TOKEN_ENV, access_token, cookie_name, is_loopback
from tunesmith.webui.server import banner, page_url

TOKEN = "t0k3n-for-tests"


def app_for(tmp_path, host, token=None):
    return build_app(WebUIState(runs_root=tmp_path / "saves", cwd=tmp_path, host=host, port=7860, token=token))


@pytest.fixture
def networked(tmp_path):
    """Bound to all addresses, so a token is required (the requests are in-process: no network is used)."""
    return TestClient(app_for(tmp_path, "0.0.0.0", TOKEN), base_url="http://webui.example:7860",
                      follow_redirects=False)


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.3.4.5", True), ("::1", True),
                                            ("[::1]", True), ("localhost", True), ("0.0.0.0", False),
                                            ("192.0.2.10", False), ("example.org", False)])
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


def test_a_token_is_generated_only_off_loopback_and_flag_or_environment_win():
    assert access_token("127.0.0.1", None, {}) == (None, False)
    token, generated = access_token("0.0.0.0", None, {})
    assert generated and len(token) >= 40
    assert access_token("0.0.0.0", None, {TOKEN_ENV: "from-env"}) == ("from-env", False)
    assert access_token("0.0.0.0", "flag", {TOKEN_ENV: "from-env"}) == ("flag", False)
    assert access_token("127.0.0.1", "flag", {}) == ("flag", False)  # local, and still asked for a token


def test_the_printed_address_carries_the_token():
    assert page_url("0.0.0.0", 7860, "abc") == "http://127.0.0.1:7860/?token=abc"
    assert page_url("::1", 80, None) == "http://[::1]:80/"
    text = banner("0.0.0.0", 7860, "/r", "abc", True)
    assert "?token=abc" in text and "generated for this session" in text


def test_local_needs_no_token_but_the_host_header_must_be_local(tmp_path):
    local = TestClient(app_for(tmp_path, "127.0.0.1"), base_url="http://127.0.0.1:7860")
    assert local.get("/api/runs").status_code == 200
    assert local.get("/api/runs", headers={"host": "localhost:7860"}).status_code == 200
    rebound = local.get("/api/runs", headers={"host": "attacker.example:7860"})
    assert rebound.status_code == 400 and "loopback" in rebound.json()["error"]


@pytest.mark.parametrize("path", ["/", "/api/runs", "/api/form", "/static/app.js", "/static/vendor/uPlot.iife.min.js",
                                  "/api/models", "/api/export/jobs"])
def test_every_request_needs_the_token(networked, path):
    assert networked.get(path).status_code == 401
    assert networked.get(path, headers={"authorization": "Bearer wrong"}).status_code == 401
    assert networked.get(path, headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_posts_need_the_token_too(networked):
    body = {"text": "cutoff_len: 64\n"}
    assert networked.post("/api/config/import", json=body).status_code == 401
    ok = networked.post("/api/config/import", json=body, headers={"authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json()["values"] == {"cutoff_len": "64"}


def test_a_browser_without_the_token_gets_a_token_form(networked):
    page = networked.get("/", headers={"accept": "text/html"})
    assert page.status_code == 401 and '<input name="token"' in page.text


def test_token_in_the_url_becomes_a_cookie_and_leaves_the_address(networked):
    response = networked.get(f"/?token={TOKEN}")
    assert response.status_code == 303 and response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{cookie_name(7860)}={TOKEN}") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    networked.cookies.set(cookie_name(7860), TOKEN)
    assert networked.get("/api/runs").status_code == 200
    networked.cookies.clear()
    assert networked.get("/?token=wrong").status_code == 401


def test_cross_site_and_non_json_changes_are_refused(tmp_path):
    local = TestClient(app_for(tmp_path, "127.0.0.1"), base_url="http://127.0.0.1:7860")
    foreign = local.post("/api/config/import", json={"text": "a: 1"}, headers={"origin": "http://evil.example"})
    assert foreign.status_code == 403 and "another origin" in foreign.json()["error"]
    form_post = local.post("/api/runs/launch", content="values=x",
                           headers={"content-type": "application/x-www-form-urlencoded"})
    assert form_post.status_code == 403 and "must be JSON" in form_post.json()["error"]
    same = local.post("/api/config/import", json={"text": "cutoff_len: 8"}, headers={"origin": "http://127.0.0.1:7860"})
    assert same.status_code == 200


def test_webui_flags_explain_themselves_and_default_to_local():
    from tunesmith.cli import webui_parser

    parser = webui_parser()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and action.help.strip(), action.option_strings
    args = parser.parse_args([])
    assert (args.host, args.port, args.runs_root, args.token) == ("127.0.0.1", 7860, "saves", None)
