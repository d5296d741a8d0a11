"""``/docs`` that works air-gapped: Swagger UI served from a packaged copy, not a CDN.

FastAPI's default ``/docs`` page loads ``swagger-ui-bundle.js`` and its stylesheet from
a public CDN, which a cluster without egress cannot reach (the page stays blank).  The
assets come from the ``swagger-ui-bundle-v2`` distribution (Swagger UI 5, which renders
the OpenAPI 3.1 document FastAPI writes) and are served under ``/docs/assets``.  ReDoc
has no packaged copy, so ``/redoc`` is not offered.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

__all__ = ["ASSETS_PATH", "install_docs"]

ASSETS_PATH = "/docs/assets"


def install_docs(app: FastAPI) -> None:
    """Add ``/docs`` (Swagger UI) and its assets to an app built with ``docs_url=None``."""
    app.mount(ASSETS_PATH, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - API",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon-32x32.png",
        )
