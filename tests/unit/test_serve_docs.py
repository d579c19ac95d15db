"""pipeline/runtime/serve/docs.py: the /docs page loads only the service's own copies of Swagger UI, the very files the
manifest records, and they are the files FastAPI's page would take from the CDN. (tests/e2e/test_serve_schema.py
opens the page of the running service in Chromium with the network cut off.)"""

from __future__ import annotations

import hashlib
import inspect
import re

import pytest

pytest.importorskip("fastapi")

from fastapi import FastAPI  # noqa: E402
from fastapi.openapi.docs import get_swagger_ui_html  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from pipeline.runtime.serve.docs import SWAGGER_UI, add_docs  # noqa: E402
from pipeline.runtime.web_assets import served_file, vendored_files  # noqa: E402

LOADED = re.compile(r"""(?:src|href)=["']([^"']+)["']""")


def docs_client(root_path: str = "") -> TestClient:
    app = FastAPI(title="t", docs_url=None, redoc_url=None)
    add_docs(app)
    return TestClient(app, root_path=root_path)


def test_the_docs_page_loads_only_the_service_s_own_files_and_each_is_the_one_the_manifest_records():
    client = docs_client()
    page = client.get("/docs")
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text and "'/openapi.json'" in page.text
    urls = LOADED.findall(page.text)
    assert len(urls) == 3 and all(url.startswith("/docs/assets/") for url in urls)
    recorded = vendored_files(SWAGGER_UI)
    for url in urls:
        asset = client.get(url)
        name = url.removeprefix("/docs/assets/")
        assert asset.status_code == 200 and hashlib.sha256(asset.content).hexdigest() == recorded[name], name
        assert asset.headers["cache-control"] == "public, max-age=86400"
    assert client.get("/docs/assets/swagger-ui-bundle.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/docs/assets/LICENSE").status_code == 404  # vendored, but not a file of the page


def test_behind_a_path_prefix_every_url_of_the_page_carries_it():
    page = docs_client(root_path="/mt").get("/docs").text
    assert all(url.startswith("/mt/docs/assets/") for url in LOADED.findall(page)) and "'/mt/openapi.json'" in page


@pytest.mark.parametrize("argument", ["swagger_js_url", "swagger_css_url"])
def test_the_vendored_swagger_ui_answers_the_cdn_urls_of_the_installed_fastapi(argument):
    default = inspect.signature(get_swagger_ui_html).parameters[argument].default
    assert served_file(default) is not None and served_file(default)[0] == SWAGGER_UI, default
