"""The service's API page, GET /docs: FastAPI's Swagger UI page, its script, stylesheet and icon served by the
service itself from the swagger-ui-dist files vendored in assets/web/ (pipeline/runtime/web_assets.py), so that the page
renders where no CDN can be reached (FastAPI's own page loads them from jsDelivr and its favicon from its site)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse

from pipeline.runtime.web_assets import PACKAGES, package_dir

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"
SWAGGER_UI = next(package for package in PACKAGES if package.name == "swagger-ui-dist")
# The vendored files never change under a version, so a browser may keep them for a day.
ASSET_HEADERS = {"Cache-Control": "public, max-age=86400"}


def add_docs(app: FastAPI) -> None:
    """Serve GET /docs and its assets (the app must be created with docs_url=None and redoc_url=None)."""
    assets = {name: package_dir(SWAGGER_UI) / name for name in SWAGGER_UI.files}

    async def docs_page(request: Request) -> HTMLResponse:
        # Behind a proxy that mounts the service under a prefix, every URL of the page carries it, as FastAPI's do.
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + (app.openapi_url or "/openapi.json"),
            title=f"{app.title} - API",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon-32x32.png",
            # No badge from Swagger's online validator (another host).
            swagger_ui_parameters={"validatorUrl": None},
        )

    async def docs_asset(request: Request) -> FileResponse:
        path = assets.get(request.path_params["name"])
        if path is None:
            raise HTTPException(404, f"no such file of the docs page: {request.path_params['name']}")
        return FileResponse(path, headers=ASSET_HEADERS)

    app.add_route(DOCS_PATH, docs_page, include_in_schema=False)
    app.add_route(ASSETS_PATH + "/{name}", docs_asset, include_in_schema=False)
