"""`GET /docs`: the API's interactive reference. Swagger UI 5 reads the OpenAPI 3.1 document this server
emits at /openapi.json; its files come from the swagger-ui-bundle-v2 package (no CDN), the page's own files
from agentdb/api/static."""

from __future__ import annotations

import swagger_ui_bundle
from fastapi import APIRouter
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from agentdb.resources import STATIC, resource

# As the playground's: only this server's scripts, no inline code, nothing loaded from or sent elsewhere
# (Swagger UI draws a few icons from data: URLs).
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

router = APIRouter(include_in_schema=False)
assets = StaticFiles(directory=swagger_ui_bundle.swagger_ui_path)


@router.get("/docs")
def page() -> Response:
    return Response(
        resource(STATIC, "docs.html").read_bytes(),
        media_type="text/html",
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
    )
